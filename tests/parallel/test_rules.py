"""The logical-axis rules table and the mesh sizes from config, without devices."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jax.sharding import PartitionSpec as P

from hone.config import MeshSection
from hone.errors import InputError
from hone.parallel.mesh import axis_sizes
from hone.parallel.rules import partition_spec


def mesh(data=1, fsdp=1, tp=1, seq=1, expert=1):
    return SimpleNamespace(shape={"data": data, "fsdp": fsdp, "expert": expert, "seq": seq,
                                  "tp": tp})


def test_names_map_to_mesh_axes():
    m = mesh(2, 2, 2)
    assert partition_spec(("embed", "mlp"), (64, 128), m) == P("fsdp", "tp")
    assert partition_spec(("mlp", "embed"), (128, 64), m) == P("tp", "fsdp")
    assert partition_spec(("vocab", "embed"), (256, 64), m) == P("tp", "fsdp")
    assert partition_spec(("embed", "heads", "head_dim"), (64, 4, 16), m) == P("fsdp", "tp")
    assert partition_spec(("embed", "lora_rank"), (64, 8), m) == P("fsdp")
    assert partition_spec(("batch", "seq"), (8, 96), m) == P(("data", "fsdp"))
    # activations' tokens over the sequence-parallel axis
    assert partition_spec(("batch", "seq", "embed"), (8, 96, 64), mesh(2, 1, 1, seq=4)) == P(
        "data", "seq")
    # stacked experts [E, D, F]: whole experts over `expert`, their matrices as dense ones;
    # rows over the expert axis too (one more data axis)
    m = mesh(fsdp=2, tp=2, expert=2)
    assert partition_spec(("expert", "embed", "mlp"), (8, 64, 32), m) == P("expert", "fsdp", "tp")
    assert partition_spec(("embed", "expert"), (64, 8), m) == P("fsdp", "expert")  # router
    assert partition_spec(("batch", "seq"), (8, 96), m) == P(("fsdp", "expert"))


def test_axes_that_do_not_divide_or_repeat_or_have_size_one_are_left_out():
    # 4 heads on tp=8: whole heads on every device; 2 kv heads likewise.
    assert partition_spec(("embed", "heads", "head_dim"), (64, 4, 16), mesh(tp=8)) == P()
    # fsdp=3 does not divide 64: replicated.
    assert partition_spec(("embed", "mlp"), (64, 128), mesh(fsdp=3)) == P()
    # batch over data x fsdp = 4 x 2 with 4 rows: falls back to data alone.
    assert partition_spec(("batch",), (4,), mesh(data=4, fsdp=2)) == P("data")
    # the same mesh axis is never used twice in one array.
    assert partition_spec(("mlp", "heads"), (8, 8), mesh(tp=2)) == P("tp")
    # unnamed arrays and unknown names are replicated; size-1 axes are dropped.
    assert partition_spec(None, (3, 4), mesh(2, 2, 2)) == P()
    assert partition_spec(("something",), (8,), mesh(2, 2, 2)) == P()
    assert partition_spec(("embed",), (64,), mesh(data=8)) == P()


def test_mesh_sizes_resolve_minus_one_and_reject_bad_shapes():
    # (data, fsdp, expert, seq, tp)
    assert axis_sizes(MeshSection(), 8) == (8, 1, 1, 1, 1)  # default: data parallel over all
    assert axis_sizes(MeshSection(data=2, fsdp=-1, tp=2), 8) == (2, 2, 1, 1, 2)
    assert axis_sizes(MeshSection(data=1, fsdp=1, tp=1), 8) == (1, 1, 1, 1, 1)  # first device
    assert axis_sizes(MeshSection(seq=4), 8) == (2, 1, 1, 4, 1)  # data takes the rest
    assert axis_sizes(MeshSection(expert=4), 8) == (2, 1, 4, 1, 1)
    with pytest.raises(InputError, match="mesh.fsdp"):
        axis_sizes(MeshSection(data=3, fsdp=-1), 8)
    with pytest.raises(InputError, match="mesh.data"):
        axis_sizes(MeshSection(seq=3), 8)
    with pytest.raises(InputError, match="only 8 device"):
        axis_sizes(MeshSection(data=4, fsdp=4), 8)
    with pytest.raises(InputError, match="mesh.seq = 16.*only 8 device"):
        axis_sizes(MeshSection(data=1, seq=16), 8)
    from hone.config import SFTConfig
    with pytest.raises(InputError, match="only one mesh axis"):
        SFTConfig(mesh=MeshSection(data=-1, fsdp=-1))
    with pytest.raises(InputError, match="mesh.seq"):
        SFTConfig(mesh=MeshSection(data=-1, seq=-1))
    with pytest.raises(InputError, match="mesh.expert"):
        SFTConfig(mesh=MeshSection(data=-1, expert=-1))


def test_an_axis_that_does_not_divide_a_large_array_is_a_warning_once_per_kind_of_weight():
    import warnings

    from hone.parallel import rules
    rules._warned.clear()
    m = mesh(tp=8)
    big = rules.WARN_BYTES
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for layer in range(3):  # 9 heads on tp=8: one warning for all the layers' q kernels
            partition_spec(("embed", "heads", "head_dim"), (576, 9, 64), m,
                           what=f"layers/{layer}/attn/q/kernel", nbytes=big)
        # small arrays, arrays that divide, and arrays given without a size stay quiet
        partition_spec(("embed", "heads"), (64, 9), m, what="small", nbytes=big - 1)
        partition_spec(("embed", "heads"), (64, 16), m, what="divides", nbytes=big)
        partition_spec(("embed", "heads"), (64, 9), m)
    assert [str(w.message) for w in caught] == [
        "layers/*/attn/q/kernel [576, 9, 64] (1,048,576 bytes) is not split over mesh.tp=8: "
        "its heads dimension (9) is not a multiple, so each device keeps a whole copy along it"]


def test_batches_must_split_over_the_mesh_and_allreduce_needs_replicated_parameters():
    from hone.config import SFTConfig
    from hone.parallel import Layout
    from hone.train.build import check_layout
    with pytest.raises(InputError, match="train.batch_size.*12 rows.*8 data x fsdp"):
        check_layout(SFTConfig(train=SFTConfig().train.__class__(batch_size=12)),
                     Layout(mesh(data=4, fsdp=2)))
    with pytest.raises(InputError, match="train.grad_accum"):
        t = SFTConfig().train.__class__(batch_size=8, grad_accum=2)
        check_layout(SFTConfig(train=t), Layout(mesh(data=8), "allreduce"))
    with pytest.raises(InputError, match="mesh.mode.*fsdp = mesh.expert = mesh.tp = 1"):
        Layout(mesh(data=4, fsdp=2), "allreduce")
    with pytest.raises(InputError, match="mesh.mode.*got fsdp 1, expert 2, tp 1"):
        Layout(mesh(data=4, expert=2), "allreduce")
    with pytest.raises(InputError, match="mesh.mode.*mesh.seq = 1"):
        Layout(mesh(data=4, seq=2), "allreduce")


def test_the_expert_axis_needs_a_mixture_of_experts_model_whose_experts_it_divides():
    import dataclasses

    from flax import nnx

    from hone.models.config import PRESETS
    from hone.parallel import Layout

    class Holder(nnx.Module):  # what check_experts reads of a model: a node's ModelConfig
        def __init__(self, name, **moe):
            cfg = PRESETS[name]
            self.config = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, **moe)) \
                if moe else cfg

    layout = Layout(mesh(data=2, expert=4))
    layout.check_experts(Holder("tiny-moe"))  # 8 experts, 2 per device
    with pytest.raises(InputError, match="mesh.expert.*this model is dense"):
        layout.check_experts(Holder("tiny"))
    with pytest.raises(InputError, match="mesh.expert.*4 does not divide the model's 6 experts"):
        layout.check_experts(Holder("tiny-moe", num_experts=6))
    Layout(mesh(data=8)).check_experts(Holder("tiny"))  # no expert axis: any model
