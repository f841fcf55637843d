"""The frozen base sharded over the ranks, the adapters data-parallel (docs/sharded.md): each rank keeps 1/N of the
bytes of each repeated block's frozen parameters; just before a block runs (forward, a checkpointed block's
recompute, backward), the ranks all-gather them and the block runs on its whole weights. Everything that trains
stays whole on every rank, and DDP keeps it equal as in DDP mode; the frozen parameters are hidden from DDP, since
they differ between ranks.

Two buffers hold the whole weights of at most two blocks: the one that runs and the next one, gathered ahead of
it (forward: the block after; backward: the block before) on a stream of its own (CUDA) or as an asynchronous
collective (gloo). A block waits for its own gather only. The gather is an all-gather (NCCL, gloo), or, with
`transport="host"` (every rank on one machine), copies from host memory: each rank writes its slices once into
files in shared memory, every rank maps (and pins) the others', and a gather copies them in (CUDA: by the copy
engines, no SMs taken from the compute) beside its own slice; the frozen bytes never change, so nothing is sent.
A block left in its buffer from the pass before is used again without a gather (the last blocks of the forward
pass are the first of the backward pass, the first of the backward pass the first of the next forward pass).

Each block can be made just before it is sharded (`build`): a model built on the meta device never has more than
one whole block of its own on a rank.

bitsandbytes' 4-bit weights (`Params4bit` in `Linear4bit`, quantized before they are sharded) are sharded as their
packed bytes, like any other frozen parameter's: the gather moves bytes, whatever their dtype. Each one's
quantization state (`quant_state`: the block scales, 1/64 of the elements or less) is not a parameter's data and
stays whole on every rank, so the gathered layer is the unsharded one byte for byte. Each parameter's bytes start
at a multiple of 256 in the buffer (the alignment of the CUDA allocator's own blocks). bitsandbytes is not imported
here. Loading a checkpoint layer by layer into this: shard_load.py; the mode in a converted script (the fit check's
choice, the notebook's own from_pretrained): fit.py and shard_mode.py."""
import time

import torch
import torch.distributed

from .shard_host import nbddp_host_copy, nbddp_host_map, nbddp_host_prefix, nbddp_host_write
from .split_place import nbddp_layer_list


_nbddp_all_gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
_NBDDP_ALIGN = 256  # each parameter's bytes start at a multiple of this in a block's flat buffer


def nbddp_quant_state_tensors(param):
    """The tensors of a bitsandbytes 4-bit parameter's quantization state (its absmax, code and offset, and the
    nested state's with double quantization), kept whole on every rank; [] for any other parameter."""
    state, out = getattr(param, "quant_state", None), []
    while state is not None:
        out += [t for t in (getattr(state, k, None) for k in ("absmax", "code", "offset"))
                if isinstance(t, torch.Tensor)]
        state = getattr(state, "state2", None)
    return out


def nbddp_blocks(model):
    """The model's repeated blocks (nbddp_layer_list's), in order."""
    return list(nbddp_layer_list(model) or [])


def _nbddp_in_backward():
    """True while autograd runs a backward pass (a checkpointed block's recompute runs its forward there)."""
    return torch._C._current_graph_task_id() != -1


class NbddpShardedBlock:
    """One block's frozen parameters: this rank's slice of their bytes; whole, as views of one of the two buffers,
    from its gather until another block takes that buffer."""

    def __init__(self, shards, block, index):
        self.shards, self.index = shards, index
        self.params = [p for p in block.parameters() if not p.requires_grad]
        for param in self.params:
            if getattr(param, "bnb_quantized", True) is False:  # bitsandbytes quantizes on its move to the GPU
                raise ValueError(f"block {index}: a 4-bit parameter not yet quantized cannot be sharded; move the "
                                 "block to its device first")
        self.layout, start = [], 0  # (parameter, shape, dtype, first byte, bytes)
        for param in self.params:
            size = param.numel() * param.element_size()
            self.layout.append((param, param.shape, param.dtype, start, size))
            start = -(-(start + size) // _NBDDP_ALIGN) * _NBDDP_ALIGN
        world, rank = shards.world, shards.rank
        self.size = -(-start // (world * _NBDDP_ALIGN)) * world * _NBDDP_ALIGN  # each rank's slice aligned too
        self.quantized = sum(1 for p in self.params if nbddp_quant_state_tensors(p))
        self.state_bytes = sum(t.numel() * t.element_size() for p in self.params for t in nbddp_quant_state_tensors(p))
        device = self.params[0].device if self.params else torch.device("cpu")
        padded = torch.zeros(self.size, dtype=torch.uint8, device=device)
        for param, _, _, first, size in self.layout:
            padded[first:first + size].copy_(param.data.reshape(-1).view(torch.uint8))
        self.shard = padded.view(world, -1)[rank].clone()
        del padded
        self.release()
        block.register_forward_pre_hook(lambda *_: shards.use(self, _nbddp_in_backward()))
        block.register_forward_hook(self.before_backward)

    def before_backward(self, block, inputs, output):
        """The block's backward reads its weights (and a checkpointed block's recompute, where the checkpoint leaves
        the block's hooks outside it): gather them again when the gradient reaches its output."""
        first = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(lambda grad: self.shards.use(self, True))

    def point(self, buffer):
        """Each frozen parameter a view of `buffer` (the same tensor: what autograd saved of it sees these bytes;
        a view taken of it, as bitsandbytes saves of a 4-bit weight, sees them too: a block always gathers into
        the same buffer at the same place)."""
        for param, shape, dtype, first, size in self.layout:
            param.data = buffer[first:first + size].view(dtype).view(shape)

    def release(self):
        for param, _, dtype, _, _ in self.layout:
            param.data = torch.empty(0, dtype=dtype, device=self.shard.device)


class NbddpShards:
    """The sharded blocks of one model, the two buffers and the gathers into them. `prefetch`: gather the next
    block while one runs (else each block's gather waits for nothing but itself). `timing`: keep each gather's time
    and each wait for one (CUDA events; on CPU the waits' host time), read by `take_timing()`."""

    def __init__(self, group=None, prefetch=True, timing=False, transport="collective"):
        self.group = group
        self.rank = torch.distributed.get_rank(group)
        self.world = torch.distributed.get_world_size(group)
        self.prefetch, self.timing, self.transport = prefetch, timing, transport
        self.host_files, self.pinned = [], []
        if transport == "host":
            self.host_prefix = nbddp_host_prefix(group)
        elif transport != "collective":
            raise ValueError(f"transport: 'collective' or 'host', not {transport!r}")
        self.blocks, self.ignored = [], []
        self.slots, self.buffers, self.ready = [None, None], [None, None], [None, None]
        self.stream = None
        self.records = []  # (kind, start, end): CUDA events, or host seconds
        self.counts = {"gathers": 0, "reused": 0}

    def add(self, block, names=None):
        """Shard `block`'s frozen parameters (`names`: their names, for DDP to ignore)."""
        sharded = NbddpShardedBlock(self, block, len(self.blocks))
        self.blocks.append(sharded)
        if self.transport == "host":  # this rank's slice, once, where the other ranks will map it
            self.host_files.append(nbddp_host_write(f"{self.host_prefix}-{sharded.index}-{self.rank}", sharded.shard))
        if names is not None:
            self.ignored += [names[id(p)] for p in sharded.params]
        return sharded

    def finish(self):
        """After the last `add`: with `transport="host"`, every rank maps the others' slices (nbddp_host_map)."""
        if self.transport == "host":
            nbddp_host_map(self)

    def use(self, block, backward):
        """`block` is about to run: its weights whole once its gather is done; the neighbour in the direction of
        the pass gathered ahead."""
        slot = self._fetch(block)
        self._wait(slot)
        if self.prefetch:
            nxt = block.index + (-1 if backward else 1)
            if 0 <= nxt < len(self.blocks):
                self._fetch(self.blocks[nxt])

    def enter(self, index):
        """Block `index` whole for code that runs its parts without calling it (so no hook of the block runs):
        Unsloth's fast decode calls `enter(i)` and `leave(i)` of its layer list's `_unsloth_block_swap`."""
        self.use(self.blocks[index], False)

    def leave(self, index):
        """Nothing to do: the block keeps its buffer until another block needs it."""

    def _buffer(self, slot, size, device):
        buffer = self.buffers[slot]
        if buffer is None or buffer.numel() < size:
            size = max([size] + [b.size for b in self.blocks])
            if buffer is not None and buffer.is_cuda and self.stream is not None:
                buffer.record_stream(self.stream)
            buffer = self.buffers[slot] = torch.empty(size, dtype=torch.uint8, device=device)
        return buffer

    def _fetch(self, block):
        """Start the gather of `block` into its buffer unless it is there already; returns the buffer's slot."""
        slot = block.index % 2
        if self.slots[slot] is block:
            self.counts["reused"] += 1
            return slot
        if self.slots[slot] is not None:
            self.slots[slot].release()
        self.slots[slot] = block
        shard = block.shard
        out = self._buffer(slot, block.size, shard.device)[:block.size]
        self.counts["gathers"] += 1
        if shard.is_cuda:
            current = torch.cuda.current_stream(shard.device)
            if self.prefetch and self.stream is None:
                self.stream = torch.cuda.Stream(shard.device)
            stream = self.stream if self.prefetch else current
            stream.wait_stream(current)  # the buffer's last reader is done with it
            with torch.cuda.stream(stream):
                start = self._event(stream)
                if self.transport == "host":
                    nbddp_host_copy(block, out)
                else:
                    _nbddp_all_gather(out, shard, group=self.group)
                done = torch.cuda.Event(enable_timing=self.timing)
                done.record(stream)
            if self.timing:
                self.records.append(("gather", start, done))
            self.ready[slot] = done
        elif self.transport == "host":
            nbddp_host_copy(block, out)
        else:
            self.ready[slot] = _nbddp_all_gather(out, shard, group=self.group, async_op=self.prefetch)
        block.point(out)
        return slot

    def _event(self, stream):
        if not self.timing:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def _wait(self, slot):
        ready, self.ready[slot] = self.ready[slot], None
        if ready is None:
            return
        if isinstance(ready, torch.cuda.Event):
            current = torch.cuda.current_stream()
            before = self._event(current)
            current.wait_event(ready)
            if self.timing:
                self.records.append(("wait", before, self._event(current)))
        else:
            started = time.perf_counter()
            ready.wait()
            if self.timing:
                self.records.append(("wait", started, time.perf_counter()))

    def take_timing(self):
        """The gathers' and the waits' milliseconds since the last call ({"gather_ms", "wait_ms", "gathers",
        "reused"}); CUDA: after a synchronize."""
        out = {"gather_ms": 0.0, "wait_ms": 0.0}
        if any(isinstance(start, torch.cuda.Event) for _, start, _ in self.records):
            torch.cuda.synchronize()
        for kind, start, end in self.records:
            ms = start.elapsed_time(end) if isinstance(start, torch.cuda.Event) else 1000 * (end - start)
            out[f"{kind}_ms"] += ms
        out.update(self.counts)
        self.records, self.counts = [], {"gathers": 0, "reused": 0}
        return out

    def state_bytes(self):
        """Bytes of the 4-bit parameters' quantization states, whole on this rank (0 without 4-bit weights)."""
        return sum(b.state_bytes for b in self.blocks)

    def whole_blocks(self):
        """The blocks whose frozen weights are whole on this rank now (at most two)."""
        return [b.index for b in self.blocks if b.params and b.params[0].numel()]

    def free(self):
        """Every block back to its share and the buffers let go (before an evaluation or a save that needs the
        memory); the next forward gathers again."""
        for slot, block in enumerate(self.slots):
            self._wait(slot)
            if block is not None:
                block.release()
        self.slots, self.buffers, self.ready = [None, None], [None, None], [None, None]


def nbddp_shard_model(model, build=None, group=None, prefetch=True, timing=False, transport="collective"):
    """Shard the frozen parameters of the model's repeated blocks over the process group; returns the `NbddpShards`.
    `build(index, block)`, if given, runs just before each block is sharded: it makes the block's weights (a model
    built on the meta device), so that a rank never holds more than one whole block of its own. `transport`:
    "collective" (an all-gather) or "host" (copies from the other ranks' slices in shared host memory; all ranks on
    one machine). The sharded parameters' names (`shards.ignored`) are given to `nbddp_ddp_ignore` for `model`: a DDP
    wrap of `model` made later (the Trainer's, by accelerate) leaves them out of its start-up broadcast, where a rank
    may hold a layer whole that another does not (a forward pass on one rank alone, with the host transport). A
    wrapper made around `model` afterwards (peft's) needs them under its own names."""
    shards = NbddpShards(group, prefetch, timing, transport)
    names = {id(p): n for n, p in model.named_parameters()}
    layers = nbddp_layer_list(model)  # found before the shard empties them
    for index, block in enumerate(layers or []):
        if build is not None:
            build(index, block)
            names.update({id(p): n for n, p in model.named_parameters()})
        shards.add(block, names)
    shards.finish()
    if layers is not None:  # what Unsloth's fast decode asks of the layer list (enter/leave around each layer it runs)
        layers._unsloth_block_swap = shards
    nbddp_ddp_ignore(model, shards.ignored)  # any DDP later built over this model (the Trainer's) leaves them alone
    return shards


def nbddp_shard_frozen(model, **kwargs):
    """Shard the frozen parameters of the model's repeated blocks over the process group; returns the names of the
    parameters DDP must leave alone (give them to `nbddp_ddp_ignore`)."""
    return nbddp_shard_model(model, **kwargs).ignored


def nbddp_ddp_ignore(model, names):
    """DDP's start-up broadcast and its reducer skip these parameters (each rank holds its own share)."""
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(names))
