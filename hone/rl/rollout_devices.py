"""The rollout on devices of its own (`grpo.rollout_devices`, `ppo.rollout_devices`): the
policy's frozen weights are placed once on a sub-mesh of this host's last N devices (after the
reference's, when it has its own too), and each rollout's trainable weights (the adapters alone
under LoRA) are sent there device to device before it samples; the policy trains on the devices
left. With `max_staleness` > 0 the rollout then runs on its devices while the update runs on the
policy's, so the two phases share no device (hone.train.lagged).

The sub-mesh is fsdp over its devices (`hone.parallel.roles.role_layout`: weights split by their
logical names); the engine's page pools are replicated over it (`hone.sampling.paged`), and the
rows come back through the host, as every rollout's do.
"""

from __future__ import annotations

from hone.parallel.roles import role_layout, split_devices
from hone.train.state import flatten, unflatten


def rollout_split(cfg, section, policy_devices) -> tuple[list | None, list | None]:
    """(the rollout's devices, the policy's) from the devices the policy would have had
    (None: all of this host's); (None, policy_devices) when the rollout shares them."""
    count = getattr(section, "rollout_devices", 0)
    if not count:
        return None, policy_devices
    return split_devices(count, f"{cfg.SECTION}.rollout_devices", "the policy",
                         devices=policy_devices)


class RolloutPlacement:
    """Where a rollout samples: the frozen weights placed once, the trainable ones sent on each
    call of `params`."""

    def __init__(self, template, frozen, devices):
        self.devices = list(devices)
        self.layout = role_layout(self.devices)
        self.template = template
        self.frozen = self.layout.place_state(frozen)

    def params(self, params: dict) -> dict:
        """The trainable weights (flat, on the policy's devices) on the rollout's shardings."""
        return flatten(self.layout.place_state(unflatten(self.template, params)))

    def describe(self) -> str:
        per_device = self.layout.device_bytes(self.frozen, self.devices[-1])
        return (f"rollouts on devices {[d.id for d in self.devices]} "
                f"({per_device / 2**20:.1f} MiB of frozen weights on each)")


def place_rollouts(cfg, section, rollouts, template, frozen, devices, log=print):
    """Point `rollouts` (hone/rl/rollouts.py) at devices of their own, when there are any."""
    if devices is None:
        return
    placement = RolloutPlacement(template, frozen, devices)
    rollouts.place_on(placement)
    log(placement.describe())
