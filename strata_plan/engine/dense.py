"""Dense weights the plan keeps in pinned RAM, read by the kernels in place there (the device loop), or, where this
torch cannot make device tensors over pinned memory (or with `in_place=False`), streamed to the device through the
store's copy queue.

    host = host_units(plan, cfg, plan_path)              # before anything is loaded: checks the plan
    model = MoEModel.load(folder, experts, context, device, dtype, host=host)
    dense = DenseStream(model, store, plan, host, keep_routers=depth > 0)   # sets model.before_layer, embed_rows

What the plan's `dense` section puts in RAM (planner/PLANNER.md, "dense"):
- `streamed_layers`: every checkpoint tensor the decoder layer holds (attention, norms, router, shared
  experts or the dense MLP) lies in one pinned region, unit after unit, each tensor 256-byte aligned.
  `staging.dense_buffers` device buffers (2, the double buffer the cost model assumes), each the size of
  the largest streamed unit, receive them; tensors made at load from others (MLA's contiguous halves of
  `kv_b_proj`, an owner's `derived()`) are not copied but refilled on the device after the copy lands.
  The units (the streamed layers in order, then the lm_head when `lm_head: ram`) are numbered u = 0..U-1
  and unit u always lands in buffer u mod n, so the layer's tensors are fixed views into that buffer
  (same offsets, same addresses every token). The model holds a streamed layer's shapes only (meta
  tensors); the layer is read here one at a time, so host memory holds one whole copy (the pinned one).
  With `keep_routers` (router lookahead on) a streamed MoE layer's router and post-attention norm stay
  resident: the lookahead gates run before their layer.
- `lm_head: ram`: the lm_head is the last unit, streamed the same way before the logits.
- `embeddings: ram`: the embedding table stays in pinned RAM; a call gathers the tokens' rows on the host
  into pinned rows and copies them up (unless the table is tied to an lm_head kept in VRAM: then the
  device already holds it and the rows are gathered there).

In place (the default, the engine's device loop): no buffers and no copies. Each streamed tensor
is a device tensor over its pinned copy (`device_view`: its device address under unified addressing), so attention,
norms, router, shared experts and the lm_head read it over PCIe as the MoE kernel reads RAM experts, inside the
token's CUDA graph (no `before_layer` hook); tensors made at load (MLA's halves) are made once and kept in VRAM.
`step_bytes()` is what a decode step reads in place (the device loop counts it).

Order on the link: the copies are `transfers.Fetch`es on the store's one copy stream, so dense units,
embedding rows and expert fetches share one ordered queue (demand before prefetch, prefetches in chunks).
`before_layer(i)` (the model calls it at the start of decoder layer i, and with i = n_layers before the
logits): the unit that ran before gives its buffer back (an event after its last kernel; the next copy
into that buffer waits for it on the GPU); the unit of layer i, if it was not issued yet, is issued as a
demand copy; the compute stream waits for its copy's event (the host waits only until the copy is
enqueued: the copy thread keeps at most `chunks_in_flight` chunks queued); then the next units in order
(wrapping to the next token) are issued as prefetches while their buffers are free: with 2 buffers,
unit u + 1 is issued when unit u starts, as the cost model has it ("double buffered, serial on the link,
must land before their layer starts"). With an odd number of units (3 or more) unit 0 shares its buffer
with the last unit, so at a token's start it is issued only after the previous token's last unit ran
(the cost model does not carry the double buffer across tokens either). Everything is allocated once; per
token only `Fetch` records and events are made. Counters: `StoreCounters.dense_bytes` (the tensors' bytes
of the units and rows that ran; a unit's copy also carries the alignment gaps, under 256 bytes a tensor)
and `dense_demand` (unit copies issued only when their layer started).
On a CPU device (CI) the buffers are CPU tensors and the copies real copies on the copy thread.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import psutil
import torch

from strata_plan.errors import UserError

from .directio import aligned_empty
from .model import DecoderLayer
from .transfer import Fetch
from .weights import TensorSource

ALIGN = 256                      # bytes: each tensor's offset in a unit (what the allocator would give)
LAYERS, LM_HEAD, EMBED = "layers", "lm_head", "embeddings"


def host_units(plan, cfg, plan_path: str = "plan") -> frozenset:
    """What the model builds in host memory for this plan (`MoEModel(host=...)`): the streamed decoder
    layers, "lm_head" and "embed". Refuses (one line) a plan that streams without dense buffers or names
    a layer the model does not have."""
    d = plan.dense
    bad = [i for i in d.streamed_layers if not 0 <= i < cfg.n_layers]
    if bad:
        raise UserError(plan_path, "dense.streamed_layers", f"layer {bad[0]} is not a decoder layer of this "
                        f"{cfg.n_layers}-layer model", "plan again for this model")
    n_units = len(d.streamed_layers) + (d.lm_head == "ram")
    if n_units and plan.staging.dense_buffers < 2:
        raise UserError(plan_path, "staging.dense_buffers", f"{plan.staging.dense_buffers} buffers for "
                        f"{n_units} streamed dense units (layers {list(d.streamed_layers)}, lm_head: {d.lm_head})",
                        "set it to 2 (the double buffer streamed dense weights need) or plan again")
    host = set(d.streamed_layers) | ({"lm_head"} if d.lm_head == "ram" else set())
    if d.embeddings == "ram" and not (cfg.spec.tied_embeddings and d.lm_head == "vram"):
        host.add("embed")
    return frozenset(host)


@dataclass
class _Part:
    owners: list                 # (object, attribute) pairs holding this tensor
    dtype: torch.dtype
    shape: tuple
    offset: int                  # bytes, in the unit
    nbytes: int
    derived: bool = False        # made from other tensors of the unit (refilled on the device, not copied)


@dataclass
class _Unit:
    index: int
    layer: int                   # decoder layer; n_layers for the lm_head
    kind: str                    # LAYERS or LM_HEAD
    buffer: int
    parts: list
    nbytes: int = 0                    # the span copied (the tensors and the alignment gaps between them)
    size: int = 0                      # in its buffer: the span and the derived tensors
    src: torch.Tensor | None = None    # uint8 view of the span in the pinned region

    @property
    def payload(self) -> int:
        """The copied tensors' bytes (what is counted: the gaps add under ALIGN bytes a tensor)."""
        return sum(p.nbytes for p in self.parts if not p.derived)

    def refill(self) -> None:
        """Recompute the derived tensors in the buffer from the landed span (on the compute stream)."""
        for p in self.parts:
            if p.derived:
                owner, name = p.owners[0]
                getattr(owner, name).copy_(owner.derived()[name])

    @property
    def what(self) -> str:
        return "the lm_head" if self.kind == LM_HEAD else f"the dense weights of decoder layer {self.layer}"


def _held_tensors(obj, skip: set, seen: set | None = None) -> list[tuple[object, str, torch.Tensor, bool]]:
    """(owner, attribute, tensor, derived) for every tensor a layer object holds, through the engine's own
    objects (attention, SwiGLU, Router); derived: made at load from another one (an owner's `derived()`);
    `skip`: (id(owner), attribute) pairs left out."""
    seen = set() if seen is None else seen
    seen.add(id(obj))
    made = set(obj.derived()) if hasattr(obj, "derived") else set()
    out = []
    for name, v in vars(obj).items():
        if isinstance(v, torch.Tensor):
            if (id(obj), name) not in skip:
                out.append((obj, name, v, name in made))
        elif hasattr(v, "__dict__") and type(v).__module__.startswith(_PACKAGE) and id(v) not in seen:
            out.extend(_held_tensors(v, skip, seen))
    return out


_PACKAGE = __name__.rpartition(".")[0]


def _layout(index: int, layer: int, kind: str, held) -> _Unit:
    """Place a unit's distinct tensors back to back, each ALIGN-aligned: the streamed ones (the copied
    span), then the derived ones (refilled on the device from the span after each copy)."""
    by_id: dict[int, _Part] = {}
    parts, off = [], 0
    for owner, name, t, derived in sorted(held, key=lambda h: h[3]):
        p = by_id.get(id(t))
        if p is None:
            nb = t.numel() * t.element_size()
            start = _up(off)
            p = by_id[id(t)] = _Part([], t.dtype, tuple(t.shape), start, nb, derived)
            parts.append((p, t))
            off = start + nb
        p.owners.append((owner, name))
    span = max((p.offset + p.nbytes for p, _ in parts if not p.derived), default=0)
    return _Unit(index, layer, kind, 0, [p for p, _ in parts], span, off)


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _typed(buf: torch.Tensor, p: _Part) -> torch.Tensor:
    return buf[p.offset:p.offset + p.nbytes].view(p.dtype).view(p.shape)


def device_view(t: torch.Tensor, address: int, device: torch.device) -> torch.Tensor:
    """A tensor on `device` over the pinned host memory of `t` (a contiguous CPU tensor) at device `address`: kernels
    read it in place over PCIe (unified addressing). It keeps `t` alive."""
    class _Interface:
        def __init__(self):
            self.__cuda_array_interface__ = {"data": (address, False), "shape": (t.numel() * t.element_size(),),
                                             "typestr": "|u1", "version": 3}
            self.keep = t
    with torch.cuda.device(device):
        raw = torch.as_tensor(_Interface(), device=device)
    return raw.view(t.dtype).view(t.shape)


def _device_views_work(device: torch.device) -> bool:
    """Whether `device_view` works here: a small pinned tensor viewed on the device reads back, and a bf16 matrix
    product over a viewed weight (cuBLAS reading it over PCIe) equals the one over its device copy."""
    try:
        t = torch.arange(64, dtype=torch.int32).pin_memory()
        w = (torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) % 7 - 3).to(torch.bfloat16).pin_memory()
        x = torch.ones((1, 64), dtype=torch.bfloat16, device=device)
        same = torch.equal(torch.nn.functional.linear(x, device_view(w, w.data_ptr(), device)),
                           torch.nn.functional.linear(x, w.to(device)))
        return bool(torch.equal(device_view(t, t.data_ptr(), device).cpu(), t)) and bool(same)
    except (RuntimeError, TypeError, ValueError):
        return False


class DenseStream:
    def __init__(self, model, store, plan, host: frozenset, keep_routers: bool = False, plan_path: str = "plan",
                 in_place: bool = True):
        self.model, self.store, self.plan_path = model, store, plan_path
        self.in_place = in_place and bool(plan.dense.streamed_layers or plan.dense.lm_head == "ram")
        if self.in_place and store.device.type == "cuda" and not _device_views_work(store.device):
            warnings.warn("this torch cannot make device tensors over pinned host memory: the streamed dense weights "
                          "are copied through buffers (the device loop runs them eagerly)", stacklevel=2)
            self.in_place = False
        self.device = store.device
        self.cuda = self.device.type == "cuda"
        self.transfers = store.transfers
        n_layers = model.cfg.n_layers
        d = plan.dense
        # ---- the units: streamed layers in order (the model holds their shapes only), then the lm_head ---
        units = []
        for i in sorted(d.streamed_layers):
            layer = model.layers[i]
            skip = set()
            if keep_routers and layer.router is not None:      # the lookahead gates read them ahead of the layer
                skip = {(id(layer), "post_norm")} | {(id(layer.router), n) for n in ("weight", "bias")}
            units.append(_layout(len(units), i, LAYERS, _held_tensors(layer, skip)))
        if d.lm_head == "ram":
            units.append(_layout(len(units), n_layers, LM_HEAD, [(model, "lm_head", model.lm_head, False)]))
        self.units = units
        self.n_buffers = plan.staging.dense_buffers if units and not self.in_place else 0
        for u in units:
            u.buffer = u.index % self.n_buffers if self.n_buffers else 0
        self.unit_of = {u.layer: u for u in units}
        host_embed = "embed" in host
        tied_to_head = bool(units) and units[-1].kind == LM_HEAD and model.lm_head is model.embed
        embed_own = host_embed and not tied_to_head
        embed_bytes = model.embed.numel() * model.embed.element_size() if embed_own else 0
        # ---- capacity, then allocate once ----------------------------------------------------------------
        self.buffer_bytes = max((u.size for u in units), default=0) if not self.in_place else 0
        total = sum(_up(u.nbytes) for u in units)
        self.rows_cap = max(1, plan.prefill_chunk)
        H = model.cfg.hidden
        row_bytes = self.rows_cap * H * model.embed.element_size() if host_embed else 0
        derived = sum(p.nbytes for u in units for p in u.parts if p.derived) if self.in_place else 0
        self._check_capacity(self.n_buffers * self.buffer_bytes + row_bytes + derived, total + embed_bytes + row_bytes)
        self._region_backing, region = aligned_empty(max(ALIGN, total + embed_bytes), pin=self.cuda)
        row = _up(max(1, self.buffer_bytes))           # every buffer starts ALIGN-aligned
        self.buffers = torch.empty((max(1, self.n_buffers), row), dtype=torch.uint8, device=self.device)
        off = 0
        src = TensorSource(store.folder)
        for u in units:
            off = _up(off)
            u.src = region[off:off + u.nbytes]
            data = [model.lm_head] if u.kind == LM_HEAD else self._read_layer(u.layer, src, keep_routers)
            for p, t in zip(u.parts, data):
                if not p.derived:
                    _typed(u.src, p).copy_(t)
                if self.in_place:             # the kernels read the pinned copy itself; derived tensors: below
                    if not p.derived:
                        view = self._in_place_view(_typed(u.src, p))
                        for owner, name in p.owners:
                            setattr(owner, name, view)
                    continue
                view = _typed(self.buffers[u.buffer], p)
                for owner, name in p.owners:
                    setattr(owner, name, view)
            if self.in_place:                 # made once from the pinned tensors, kept in VRAM
                for p in u.parts:
                    if p.derived:
                        owner, name = p.owners[0]
                        made = owner.derived()[name].to(self.device)
                        for o, n in p.owners:
                            setattr(o, n, made)
            off += u.nbytes
        # ---- embeddings --------------------------------------------------------------------------------
        self.embed_host = None
        if host_embed:
            if tied_to_head:
                lm = units[-1]
                self.embed_host = _typed(lm.src, lm.parts[0])
            else:
                off = _up(off)
                self.embed_host = region[off:off + embed_bytes].view(model.dtype).view(model.embed.shape)
                self.embed_host.copy_(model.embed)
            model.embed = self.embed_host
            self._alloc_rows(self.rows_cap)
            model.embed_rows = self.embed_rows
        # ---- state ---------------------------------------------------------------------------------------
        self._issued: list = [None] * len(units)          # per unit: its copy, issued and not yet used
        self._owner: list = [None] * max(1, self.n_buffers)   # per buffer: the unit last issued into it
        self._busy = [False] * max(1, self.n_buffers)      # issued into and not yet given back
        self._release: list = [None] * max(1, self.n_buffers)  # event after the last kernel that read it
        self._running: _Unit | None = None
        self._next = 0
        self._row_fetch: Fetch | None = None
        if units and not self.in_place:
            model.before_layer = self.before_layer

    def _in_place_view(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (in the pinned region) as the kernels read it: on a GPU a device tensor at its device address (read over
        PCIe, `device_view`); on a CPU (the stand-in) `t` itself."""
        if not self.cuda:
            return t
        return device_view(t, self._device_address(t), self.device)

    def _device_address(self, t: torch.Tensor) -> int:
        """The device address of a tensor in the pinned region: a registered `HostRegion` at its device address, torch's
        pinned memory (cudaHostAlloc) at its host address (unified addressing)."""
        r = self._region_backing
        if getattr(r, "registered", False):
            return r.device_ptr + (t.data_ptr() - r.host_ptr)
        return t.data_ptr()

    def close(self) -> None:
        """Unhook from the model (no reference cycle left) and unregister the pinned region of the dense weights now (a
        `HostRegion`; torch's pinned memory needs nothing): the kernels no longer read it."""
        for hook in ("embed_rows", "before_layer"):
            if getattr(getattr(self.model, hook, None), "__self__", None) is self:
                setattr(self.model, hook, None)
        close = getattr(self._region_backing, "close", None)
        if close is not None:
            close()

    def step_bytes(self) -> dict[str, int]:
        """In place: the dense bytes a decode step reads from pinned RAM (the streamed layers', the lm_head's)."""
        out = {LAYERS: 0, LM_HEAD: 0}
        if self.in_place:
            for u in self.units:
                out[u.kind] += u.payload
        return out

    # ---- start-up ---------------------------------------------------------------------------------------
    def _read_layer(self, i: int, src, keep_routers: bool) -> list[torch.Tensor]:
        """Decoder layer i read into host memory (one layer at a time: the pinned region is the only whole
        copy): its tensors in the order of the unit's parts. The router and post-attention norm that stay
        resident go to the device here."""
        layer = self.model.layers[i]
        built = DecoderLayer(self.model.cfg, src, i, layer.moe_index, "cpu", self.model.dtype)
        skip = set()
        if keep_routers and layer.router is not None:
            layer.post_norm, layer.router.weight = built.post_norm.to(self.device), built.router.weight.to(self.device)
            layer.router.bias = None if built.router.bias is None else built.router.bias.to(self.device)
            skip = {(id(built), "post_norm")} | {(id(built.router), n) for n in ("weight", "bias")}
        seen, out = set(), []
        for _, _, t, derived in sorted(_held_tensors(built, skip), key=lambda h: h[3]):
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def _check_capacity(self, vram: int, ram: int) -> None:
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            if vram > free:
                raise UserError(self.plan_path, "staging.dense_buffers", f"the dense buffers need "
                                f"{vram / 1e9:.2f} GB of VRAM, {free / 1e9:.2f} GB is free",
                                "plan again with a smaller --vram-gb")
        avail = psutil.virtual_memory().available
        if ram > avail:
            raise UserError(self.plan_path, "dense.streamed_layers", f"the dense weights kept in pinned RAM need "
                            f"{ram / 1e9:.2f} GB, {avail / 1e9:.2f} GB is available", "plan again with a smaller --ram-gb")

    def _alloc_rows(self, n: int) -> None:
        H = self.model.cfg.hidden
        self.rows_cap = n
        self.rows_host = torch.empty((n, H), dtype=self.model.dtype, pin_memory=self.cuda)
        self.rows_dev = torch.empty((n, H), dtype=self.model.dtype, device=self.device)

    # ---- per call ------------------------------------------------------------------------------------
    def _event(self):
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(self.store.compute_stream)
        return ev

    def _issue(self, u: _Unit, demand: bool) -> None:
        b = u.buffer
        f = Fetch(u.layer, -1, 0, u.nbytes, demand, ram=u.src, dst=self.buffers[b][:u.nbytes],
                  after=self._release[b], what=u.what)
        self._issued[u.index], self._owner[b], self._busy[b] = f, u.index, True
        if demand:
            self.transfers.copy_now(f)
        else:
            self.transfers.submit(f)

    def _evict(self, b: int) -> None:
        """Buffer b holds a unit issued out of turn (a forward pass cut short): drop or finish its copy."""
        v = self._owner[b]
        f = self._issued[v]
        if f is not None and not self.transfers.cancel(f):
            f.wait_enqueued()
        self._issued[v], self._busy[b] = None, False

    def before_layer(self, i: int) -> None:
        """Decoder layer i starts (i = n_layers: the logits)."""
        if self._running is not None:            # the unit before has all its kernels queued
            b = self._running.buffer
            self._release[b], self._busy[b], self._running = self._event(), False, None
        u = self.unit_of.get(i)
        if u is not None:
            f = self._issued[u.index]
            if f is None:
                if self._busy[u.buffer]:
                    self._evict(u.buffer)
                self._issue(u, demand=True)
                self._next = (u.index + 1) % len(self.units)
                f = self._issued[u.index]
            f.wait_enqueued()
            if f.event is not None:
                self.store.compute_stream.wait_event(f.event)
            u.refill()
            self._issued[u.index], self._running = None, u
            c = self.store.counters
            c.dense_bytes[u.kind] += u.payload
            c.dense_demand += int(f.demand)
        self._prefetch()

    def _prefetch(self) -> None:
        """Issue the next units in order while their buffers are free."""
        for _ in range(len(self.units)):
            u = self.units[self._next]
            if self._issued[u.index] is not None or self._busy[u.buffer]:
                return
            self._issue(u, demand=False)
            self._next = (self._next + 1) % len(self.units)

    def embed_address(self) -> int | None:
        """The device address of the pinned embedding table (a kernel reads its rows in place there,
        `kernels.gather`), or None (no table in RAM, or a CPU device). A large table is in a registered region
        (`pinned.HostRegion`, at its device address); a small one in torch's pinned memory (cudaHostAlloc), which
        under unified addressing a kernel reads at its host address."""
        if self.embed_host is None or not self.cuda:
            return None
        if getattr(self._region_backing, "registered", False) or self.embed_host.is_pinned():
            return self._device_address(self.embed_host)
        return None

    def embed_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows [T, H] of token_ids [T]: gathered on the host from pinned RAM, copied up."""
        ids = token_ids.cpu()                    # the host needs the ids (a decode step's id is already there)
        t = ids.shape[0]
        prev = self._row_fetch
        if prev is not None and prev.event is not None:
            prev.event.synchronize()             # the pinned rows are free again
        if t > self.rows_cap:                    # a prefill chunk longer than the plan's: grow once
            self._alloc_rows(t)
        torch.index_select(self.embed_host, 0, ids, out=self.rows_host[:t])
        src, dst = self.rows_host[:t].view(-1).view(torch.uint8), self.rows_dev[:t].view(-1).view(torch.uint8)
        f = Fetch(-1, -1, 0, src.numel(), True, ram=src, dst=dst, after=self._event(), what="the embedding rows")
        self.transfers.copy_now(f)
        if f.event is not None:
            self.store.compute_stream.wait_event(f.event)
        self._row_fetch = f
        self.store.counters.dense_bytes[EMBED] += src.numel()
        return self.rows_dev[:t]
