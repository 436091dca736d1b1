"""The paged KV cache's programs: a prompt chunk into pages, decode steps of every slot over
its pages, a page copy. The host side (which pages, which sequences) is
hone/sampling/scheduler.py.

Layout: per layer one pool of keys and one of values, [num_pages, K, page_size, H] (each page
kv-head-major, as the static cache is, so a page reads as a block of the decode attention's
cache). A sequence's page table lists its pages in order; its slot s is page table[s // P] at
offset s % P, and its position is its slot: a paged sequence has no padding inside it.

Design choices:
- A fixed set of programs, whatever the sequences: a decode window takes a row bucket of the
  running sequences (padded rows write to the trash page and are masked out) over their whole
  page tables; a prefill call takes blocks of a fixed width (a prompt's chunk is one or more
  blocks, each with its sequence's whole page table), their count a power of two. Weights are
  arguments, so new weights reuse the compiled programs (`PagedEngine.warmup` compiles them all).
- Decode windows: `decode_window` runs many decode steps in one program, and what a sequence
  carries between windows (its pending token, length, index, whether it runs) lives in the
  engine's places on the device, so a window can go out before the one before it was read
  (hone/sampling/scheduler.py). `choose_first` draws a sequence's first token into its place.
- Attention over pages. Decode runs `Attention.attend_step` over the pools themselves: its
  blockwise loop reads one page per row as a block (a gather of [rows] pages), so no row's
  cache is ever copied whole, and only up to the longest row's last page. A block past a row's
  last key adds exactly zero (its weights are exp(-inf) and the running maximum does not move),
  so a row's numbers do not depend on how long the other rows are. Prefill blocks read the
  pages the same way (hone/kernels/paged_xla.py: a loop over page columns up to the last page
  a block sees), so a block costs what its sequence holds, not its table's width. Masks are
  causality over the slots and the sliding window, so the numbers are those of the static
  sampler and of the training forward pass up to float32 summation order. On the CPU,
  where the sampler runs hone's kernels, the decode-attention kernel reads the pages itself
  (hone/kernels/decode_attention.cc, the same computation as on a contiguous cache).
- Sampling keys come with the rows: token t of a sequence is drawn with fold_in(its key, t), so
  it does not depend on the batch it was decoded in.
"""

from __future__ import annotations

import collections
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hone.kernels.paged_xla import gathered_attention, ragged_attention
from hone.kernels.ragged_paged import ragged_paged_attention
from hone.models.attention import make_mask
from hone.sampling.engine import attach_packed
from hone.sampling.pages import TRASH
from hone.sampling.strategies import SamplingMode, choose

TRACES: collections.Counter = collections.Counter()  # compiles per program; tests read it

# {"k": [L x [K, P, page, H]], "v": [...]}: kv-head major, the layout of the Pallas paged-attention
# kernels (jax.experimental.pallas.ops.gpu / tpu) and of hone's CPU kernel.
Pools = dict[str, list[jax.Array]]


TPU_HEAD_DIM = 128  # the TPU kernel's head dimension must be a multiple of this (PagedEngine)
# hone's ragged paged-attention kernel (hone/kernels/ragged_paged.py) as the engine's route for
# prefill blocks and decode steps alike, sliding windows included: route -> the kernel's impl.
RAGGED_ROUTES = {"ragged": "tpu", "ragged-interpret": "tpu-interpret"}
# XLA's own routes for every layer's decode step: "loop" XLA's loop over page columns with dot
# products (hone/kernels/paged_xla.py's ragged_attention, as prefill reads), "dense" every row's
# whole table gathered and read with dense products (gathered_attention). The default decode
# (None) is Attention.attend_step's blockwise loop of float32 sums, written for XLA:CPU.
XLA_ROUTES = ("loop", "dense")


def _ragged(attn, q, k_pool, v_pool, table, q_pos, kv_len, window, route):
    """Attention of q [R, T, N, H] over the pages through hone's ragged kernel, projected."""
    out = ragged_paged_attention(q, k_pool, v_pool, table, q_pos, kv_len, scale=attn.scale,
                                 softcap=attn.softcap, window=window, impl=RAGGED_ROUTES[route])
    return attn.o(out.astype(q.dtype))


def _xla(attn, q, k_pool, v_pool, table, q_pos, window, route, fixed):
    """Attention of q [R, T, N, H] over the pages through an XLA_ROUTES route, projected."""
    read = ragged_attention if route == "loop" else gathered_attention
    extra = {"fixed": fixed} if route == "loop" else {}
    out = read(q, k_pool, v_pool, table, q_pos, scale=attn.scale, softcap=attn.softcap,
               window=window, **extra)
    return attn.o(out.astype(q.dtype))


def rollout_engine(engine: str) -> str:
    """The engine an RL rollout's `engine` setting names here: "auto" is the paged engine on a
    CPU, where it measured 2.03x the static sampler's tokens per second on a long-tail
    rollout, and the static sampler on an accelerator, where the paged engine measured 0.18x
    on a TPU v5e (benchmarks/RESULTS.md "Rollouts"); "paged" and "static" are themselves."""
    if engine != "auto":
        return engine
    return "paged" if jax.default_backend() == "cpu" else "static"


def paged_route() -> str | None:
    """The decode step's attention over pages on this backend when none is asked for: the Pallas
    kernel on a GPU; XLA's loop on a TPU, where JAX's Pallas TPU kernel measured slower than it
    (TPU v5e, qwen3-0.6b in bfloat16, head_dim 128: 1,050 against 1,368 tokens/s on the
    long-tail rollout, 1,205 against 2,046 on a uniform one; benchmarks/RESULTS.md), so it is
    taken only when asked for (`PagedEngine(attention="tpu")`); None on a CPU (hone's CPU kernel
    reading the pages, or XLA's loop)."""
    return "gpu" if jax.default_backend() == "gpu" else None


def init_pools(model, num_pages: int, page_size: int, dtype) -> Pools:
    """Zeroed pools on the weights' devices: replicated over their mesh when the weights are
    sharded (an RL policy on a mesh), so the engine's programs see one device set."""
    cfg = model.config
    shape = (cfg.num_kv_heads, num_pages, page_size, cfg.head_dim)
    pools = _zero_pools(shape, jnp.dtype(dtype), len(cfg.layer_types))
    sharding = model.embedder.embedding[...].sharding
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
        pools = jax.device_put(pools, NamedSharding(sharding.mesh, PartitionSpec()))
    return pools


@partial(jax.jit, static_argnames=("shape", "dtype", "layers"))
def _zero_pools(shape, dtype, layers: int) -> Pools:
    """Every layer's pools in one program (60 eager zeros took 0.3 s for 0.76 GB)."""
    return {"k": [jnp.zeros(shape, dtype) for _ in range(layers)],
            "v": [jnp.zeros(shape, dtype) for _ in range(layers)]}


def pool_bytes(model, num_pages: int, page_size: int, dtype) -> int:
    cfg = model.config
    return (2 * len(cfg.layer_types) * num_pages * cfg.num_kv_heads * page_size * cfg.head_dim
            * jnp.dtype(dtype).itemsize)


def _write(pool: jax.Array, pages: jax.Array, offsets: jax.Array, new: jax.Array) -> jax.Array:
    """Keys or values new [R, T, K, H] into pool [K, P, page, H] at pages/offsets [R, T]."""
    return pool.at[:, pages, offsets].set(new.transpose(2, 0, 1, 3).astype(pool.dtype))


def _store(pools: Pools, out: Pools, i: int, pages, offsets, k, v):
    """Layer i's new keys and values written into its pools; the new pools also appended to
    `out` (the pools the program returns). Returns (keys pool, values pool)."""
    k_pool = _write(pools["k"][i], pages, offsets, k)
    v_pool = _write(pools["v"][i], pages, offsets, v)
    out["k"].append(k_pool)
    out["v"].append(v_pool)
    return k_pool, v_pool


def _where(table: jax.Array, slots: jax.Array, live: jax.Array, page_size: int):
    """(page, offset) of each slot [R, T] of each row (the trash page where not `live`)."""
    column = jnp.clip(slots // page_size, 0, table.shape[1] - 1)
    pages = jnp.take_along_axis(table, column, axis=1)
    return jnp.where(live, pages, TRASH), jnp.where(live, slots % page_size, 0)


@partial(jax.jit, static_argnames=("graphdef", "page_size", "fixed", "pallas"),
         donate_argnames=("pools",))
def prefill_chunk(graphdef, params, pools: Pools, table, start, tokens, n_valid, last, *,
                  page_size: int, fixed: bool = False,
                  pallas: str | None = None) -> tuple[Pools, jax.Array]:
    """Run R blocks of tokens [R, C], block r at slots start[r]..start[r]+C-1 of its sequence
    (the first n_valid [R] of them real; a prompt's chunk is one or more blocks side by side,
    each with its sequence's page table: table [R, n]), their keys and values written into the
    pages. Returns the pools and the logits [L, V] of the last real token of the blocks `last`
    [L]. Earlier slots (an earlier chunk or block, a shared prompt) are read from the pages,
    page by page (hone/kernels/paged_xla.py: never a gathered cache), up to the last page a
    block sees, so a block costs what its sequence holds, whatever n is. fixed: loop over all n
    page columns (a GPU: no data-dependent loop). pallas: a RAGGED_ROUTES route reads them
    through hone's ragged kernel instead (other routes are the decode step's alone)."""
    TRACES["prefill_chunk"] += 1
    model = nnx.merge(graphdef, params)
    r, c = tokens.shape
    slots = start[:, None] + jnp.arange(c, dtype=jnp.int32)[None]  # [R, C]
    real = jnp.arange(c)[None] < n_valid[:, None]
    pages, offsets = _where(table, slots, real, page_size)
    q_pos = jnp.where(real, slots, -1)
    ropes = model.rope_for(slots)
    x = model.embedder.encode(tokens)
    out: Pools = {"k": [], "v": []}
    for i, layer in enumerate(model.layers):
        kind = layer.layer_type
        cos, sin = ropes[kind]
        window = model.window_for(kind)

        def attend(h, i=i, cos=cos, sin=sin, layer=layer, window=window):
            attn = layer.attn
            q, k, v = attn.project_qkv(h, cos, sin)
            k_pool, v_pool = _store(pools, out, i, pages, offsets, k, v)
            if pallas in RAGGED_ROUTES:
                return _ragged(attn, q, k_pool, v_pool, table, q_pos, start + n_valid, window,
                               pallas)
            got = ragged_attention(q, k_pool, v_pool, table, q_pos, scale=attn.scale,
                                   softcap=attn.softcap, window=window, fixed=fixed)
            return attn.o(got.astype(q.dtype))

        x = layer(x, attend)
    hidden = x[last, n_valid[last] - 1][:, None]  # [L, 1, D]
    return out, model.logits_from_hidden(model.final_norm(hidden))[:, 0]


def choose_rows(logits: jax.Array, keys: jax.Array, mode: SamplingMode, temperature,
                top_p) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`choose` row by row, each row [V] with its own key: (token, logprob, sampling_logprob)."""
    def one(row, key):
        token, lp, slp = choose(row[None], key, mode, temperature, top_p)
        return token[0], lp[0], slp[0]
    return jax.vmap(one)(logits, keys)


# The engine's places on the device, [S + 1] each (S = max_seqs; place S is where padded rows
# of a decode window read and write, never a sequence's): what a running sequence carries from
# one decode window to the next without the host reading it, and the first token drawn for a
# sequence that starts, kept until the window that starts it reads it out.
PLACE_FIELDS = {"last": jnp.int32, "length": jnp.int32, "index": jnp.int32, "active": jnp.bool_,
                "first_token": jnp.int32, "first_logprob": jnp.float32,
                "first_sampling_logprob": jnp.float32}
Places = dict[str, jax.Array]


def init_places(max_seqs: int, pools: Pools) -> Places:
    """Zeroed places, on the pools' devices."""
    places = _zero_places(max_seqs + 1)
    sharding = pools["k"][0].sharding
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
        places = jax.device_put(places, sharding)
    return places


@partial(jax.jit, static_argnames=("n",))
def _zero_places(n: int) -> Places:
    return {name: jnp.zeros((n,), dtype) for name, dtype in PLACE_FIELDS.items()}


@partial(jax.jit, static_argnames=("mode",), donate_argnames=("places",))
def choose_first(logits: jax.Array, row, key_data: jax.Array, index: jax.Array, places: Places,
                 place: jax.Array, mode: SamplingMode, temperature, top_p) -> Places:
    """The first tokens of R samples of one prompt from its last logits (row `row` of a prefill
    call's logits [L, V]): sample r drawn with fold_in(key r, index r) (key_data [R, ...]: raw
    keys), written to its place ([R]) as the pending token and as the first token that the
    decode window starting it reads out. Stays on the device: nothing is read here. One
    program, not the dozens of small operations an eager draw dispatches (17 ms a group on the
    2-core CPU)."""
    TRACES["choose_first"] += 1
    keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(key_data), index)
    rows = jnp.broadcast_to(logits[row], (index.shape[0], logits.shape[1]))
    token, lp, slp = choose_rows(rows, keys, mode, temperature, top_p)
    return dict(places, last=places["last"].at[place].set(token),
                first_token=places["first_token"].at[place].set(token),
                first_logprob=places["first_logprob"].at[place].set(lp),
                first_sampling_logprob=places["first_sampling_logprob"].at[place].set(slp))


@partial(jax.jit, static_argnames=("graphdef", "mode", "page_size", "steps", "pallas", "fixed"),
         donate_argnames=("pools", "places"))
def decode_window(graphdef, params, packed, pools: Pools, places: Places, table,
                  rows: dict[str, jax.Array], eos_ids, temperature, top_p, *, mode: SamplingMode,
                  page_size: int, steps: int, pallas: str | None = None,
                  fixed: bool = False) -> tuple[Pools, Places, dict[str, jax.Array]]:
    """A decode window: `steps` decode steps of R rows (table [R, n]: each row's first n pages)
    in one program, fewer when every row has stopped (unless `fixed`: XLA:GPU's data-dependent
    loop reads its predicate on the host every step).

    rows, [R]: `place` (the row's place; S for padding), `fresh` (the row starts here: its
    `length` and `index` are given, else they and `last` and `active` come from its place, as
    the window before left them), `host_last` (its pending token is given in `last`, else it is
    the place's: a first token `choose_first` drew), `limit` (the index at which the turn
    stops) and `key_data` (its sampling key, raw). Per row: `last` (the pending token, not yet
    in the cache, goes to slot `length`), `index` (the token index `last`'s successor gets).
    A row that stops mid-window (an end token, its limit) is masked for the rest of it: it
    writes to the trash page and emits nothing.

    Returns the pools, the places (each row's state written back) and what the window emitted:
    [R, steps] `tokens`, `logprobs`, `sampling_logprobs`, `emitted` (False where a row was
    stopped), and [R] the `first_*` token of each row as its place holds it.
    pallas: a route of hone/kernels/pallas_paged.py for the layers without a sliding window, or
    of RAGGED_ROUTES for every layer (None: hone's CPU kernel when `packed`, else XLA's
    blockwise loop over pages)."""
    TRACES["decode_window"] += 1
    model = nnx.merge(graphdef, params)
    attach_packed(model, packed)
    place = rows["place"]
    held = {name: places[name][place] for name in ("last", "length", "index", "active")}
    last = jnp.where(rows["host_last"], rows["last"], held["last"])
    length = jnp.where(rows["fresh"], rows["length"], held["length"])
    index = jnp.where(rows["fresh"], rows["index"], held["index"])
    active = jnp.where(rows["fresh"], ~jnp.isin(last, eos_ids) & (index < rows["limit"]),
                       held["active"])
    state = {"last": last, "length": length, "index": index, "limit": rows["limit"],
             "key": jax.random.wrap_key_data(rows["key_data"]), "active": active}
    r, n = table.shape
    s = n * page_size
    k_index = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (r, s))

    def body(j, pools, st, out):
        pos, act = st["length"], st["active"]
        pages, offsets = _where(table, pos[:, None], act[:, None], page_size)
        ropes = model.rope_for(pos[:, None])
        k_valid = (k_index <= pos[:, None]) & act[:, None]
        used = jnp.max(jnp.where(act, pos, 0)) + 1
        x = model.embedder.encode(st["last"][:, None])
        new: Pools = {"k": [], "v": []}
        for i, layer in enumerate(model.layers):
            kind = layer.layer_type
            cos, sin = ropes[kind]
            window = model.window_for(kind)
            mask = make_mask(pos[:, None], k_index, k_valid, window)
            # JAX's kernels mask by length alone; hone's ragged kernel takes windows too
            route = pallas if window is None or pallas in (*RAGGED_ROUTES, *XLA_ROUTES) else None

            def attend(h, i=i, cos=cos, sin=sin, layer=layer, mask=mask, route=route,
                       window=window):
                q, k, v = layer.attn.project_qkv(h, cos, sin)
                k_pool, v_pool = _store(pools, new, i, pages, offsets, k, v)
                if route in RAGGED_ROUTES:
                    return _ragged(layer.attn, q, k_pool, v_pool, table, pos[:, None],
                                   jnp.where(act, pos + 1, 0), window, route)
                if route in XLA_ROUTES:
                    return _xla(layer.attn, q, k_pool, v_pool, table,
                                jnp.where(act, pos, -1)[:, None], window, route, fixed)
                return layer.attn.attend_step(q, k_pool, v_pool, mask, used, pages=table,
                                              kernel=bool(packed), pallas=route)

            x = layer(x, attend)
        logits = model.logits_from_hidden(model.final_norm(x))[:, 0]
        keys = jax.vmap(jax.random.fold_in)(st["key"], st["index"])
        token, lp, slp = choose_rows(logits, keys, mode, temperature, top_p)
        stop = jnp.isin(token, eos_ids) | (st["index"] + 1 >= st["limit"])
        out = {"tokens": out["tokens"].at[:, j].set(jnp.where(act, token, 0)),
               "logprobs": out["logprobs"].at[:, j].set(jnp.where(act, lp, 0.0)),
               "sampling_logprobs": out["sampling_logprobs"].at[:, j].set(
                   jnp.where(act, slp, 0.0)),
               "emitted": out["emitted"].at[:, j].set(act)}
        st = dict(st, last=jnp.where(act, token, st["last"]), length=pos + act,
                  index=st["index"] + act, active=act & ~stop)
        return new, st, out

    out = {"tokens": jnp.zeros((r, steps), jnp.int32),
           "logprobs": jnp.zeros((r, steps), jnp.float32),
           "sampling_logprobs": jnp.zeros((r, steps), jnp.float32),
           "emitted": jnp.zeros((r, steps), jnp.bool_)}
    if fixed:
        pools, state, out = jax.lax.fori_loop(
            0, steps, lambda j, c: body(j, *c), (pools, state, out))
    else:
        def cond(carry):
            j, _, st, _ = carry
            return (j < steps) & jnp.any(st["active"])

        def step(carry):
            j, pools, st, out = carry
            return (j + 1, *body(j, pools, st, out))

        _, pools, state, out = jax.lax.while_loop(cond, step, (jnp.int32(0), pools, state, out))
    places = dict(places, **{name: places[name].at[place].set(state[name])
                             for name in ("last", "length", "index", "active")})
    out.update({name: places[name][place] for name in
                ("first_token", "first_logprob", "first_sampling_logprob")})
    return pools, places, out


@partial(jax.jit, donate_argnames=("pools",))
def copy_pages(pools: Pools, src, dst) -> Pools:
    """Page src[i] copied to page dst[i] in every layer (a forked sample's own copy of its
    prompt's partly filled last page)."""
    TRACES["copy_pages"] += 1
    return {name: [pool.at[:, dst].set(pool[:, src]) for pool in pools[name]]
            for name in pools}
