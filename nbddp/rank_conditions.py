"""What reads the rank or the world size, by what it reads: a value of torch.distributed, the launcher's environment
(`os.environ["RANK"]`, `os.getenv("WORLD_SIZE")`), an attribute of a value that accelerate, a Trainer, its arguments
or Lightning made (`accelerator.is_main_process`, `trainer.args.world_size`), nbddp's own rank names, the notebook's
names bound to one of those (`main = dist.get_rank() == 0`), and the notebook's functions that return one (also those
of a module of its own, nbddp.written). A name
alone says nothing: a LoRA `rank = 16` is a number.

    reads_rank(node, names)    -> {"rank", "world", "gpus"}: what of the job's shape the node reads (empty: nothing;
                                  "gpus": `torch.cuda.device_count()`, the width a one-process notebook's batch
                                  spreads over, which the batch step counts as the world)
    is_rank_test(node, names)  -> an `if` whose test reads the rank: its body already runs per process (the rank guards,
                                  nbddp.needs and the other steps leave it as it is)
"""
from __future__ import annotations

import libcst as cst

from .bindings import returns_of
from .entries import is_entry, is_trainer
from .meanings import PARTIALS
from .vocabulary import CONFIG, kinds
from .walk import walk

RANK, WORLD = "rank", "world"
# nbddp's runtime names (what a converted script reads): converting converted code keeps their meaning.
OWN = {"NBDDP_IS_MAIN": RANK, "NBDDP_RANK": RANK, "NBDDP_LOCAL_RANK": RANK, "NBDDP_IS_LOCAL_MAIN": RANK,
       "NBDDP_WORLD_SIZE": WORLD}
GPUS = "gpus"  # the GPUs a one-process notebook spreads its batch over (a Trainer's n_gpu): the world, for the batch
DISTRIBUTED = {"torch.distributed.get_rank": RANK, "torch.distributed.get_node_local_rank": RANK,
               "torch.distributed.get_world_size": WORLD,
               "torch.cuda.device_count": GPUS,
               # other libraries' readers of the same group's rank and size (they read torch.distributed or the
               # launcher's environment)
               "deepspeed.comm.get_rank": RANK, "deepspeed.comm.get_local_rank": RANK,
               "deepspeed.comm.get_world_size": WORLD, "ignite.distributed.get_rank": RANK,
               "ignite.distributed.get_local_rank": RANK, "ignite.distributed.get_world_size": WORLD,
               "horovod.torch.rank": RANK, "horovod.torch.local_rank": RANK, "horovod.torch.size": WORLD}
ENVIRONMENT = {"RANK": RANK, "LOCAL_RANK": RANK, "GROUP_RANK": RANK, "NODE_RANK": RANK, "WORLD_SIZE": WORLD,
               "LOCAL_WORLD_SIZE": WORLD}  # what torchrun sets
ENVIRONMENT_READS = frozenset({"os.environ", "os.environ.get", "os.getenv", "os.environ.__getitem__"})
# The classes whose values know the job's shape, by qualified name, and the attributes that tell it.
STATE_CLASSES = frozenset({"accelerate.Accelerator", "accelerate.PartialState", "accelerate.state.PartialState",
                           "accelerate.state.AcceleratorState", "lightning.Fabric",
                           "lightning.fabric.Fabric", "lightning.Trainer", "pytorch_lightning.Trainer",
                           "transformers.TrainingArguments"})
ATTRIBUTES = {"process_index": RANK, "local_process_index": RANK, "is_main_process": RANK,
              "is_local_main_process": RANK, "is_last_process": RANK, "is_world_process_zero": RANK,
              "is_local_process_zero": RANK, "global_rank": RANK, "local_rank": RANK, "node_rank": RANK,
              "is_global_zero": RANK, "should_save": RANK, "should_log": RANK,
              "num_processes": WORLD, "world_size": WORLD, "n_gpu": WORLD,
              # accelerate's decorators that run a function on the processes they pick
              "on_process": RANK, "on_local_process": RANK, "on_last_process": RANK, "on_main_process": RANK,
              "on_local_main_process": RANK}
# Of those, the flags only rank 0 (of the job, or of each machine) holds true (nbddp.transforms.rank_blocks)
RANK_ZERO = frozenset({"is_main_process", "is_local_main_process", "is_world_process_zero", "is_local_process_zero",
                       "is_global_zero", "should_save", "on_main_process", "on_local_main_process", "NBDDP_IS_MAIN",
                       "NBDDP_IS_LOCAL_MAIN"})
PROPERTIES = frozenset({"builtins.property", "functools.cached_property"})
MAX_DEPTH = 4
CALLED = frozenset({"get", "getenv", "__getitem__"} | {m.rsplit(".", 1)[1] for m in DISTRIBUTED} | set(ATTRIBUTES))


def _of_value(meaning: str, names) -> str | None:
    """What a meaning reads of the job's shape: `accelerate.Accelerator().process_index` -> rank."""
    if meaning in DISTRIBUTED:
        return DISTRIBUTED[meaning]
    segments = meaning.split(".")
    if len(segments) < 2 or segments[-1] not in ATTRIBUTES:
        return None
    owner = ".".join(segments[:-1])
    while owner.endswith((".args", ".state", ".accelerator")):  # a Trainer's arguments or accelerator, a state
        owner = owner.rsplit(".", 1)[0]
    if "." not in owner and "(" not in owner and "[" not in owner:  # a parameter, a name bound in another cell
        return ATTRIBUTES[segments[-1]]  # (`state.is_world_process_zero` in a callback): what it is, unknown
    if not owner.endswith("()"):
        return None
    made_by = owner[:-2]
    if is_entry(made_by, STATE_CLASSES) or is_trainer(made_by) or CONFIG in kinds([made_by], names.packages):
        return ATTRIBUTES[segments[-1]]
    return None


def node_reads(node, names, depth=0) -> set:
    """What one node itself reads of the job's shape, RANK and WORLD (a count of GPUs is no test of the job's shape:
    only the batch step asks for it, through reads_rank)."""
    return _node_reads(node, names, depth) - {GPUS}


def _node_reads(node, names, depth=0) -> set:
    """What one node itself reads of the job's shape (a name through its value, an attribute, a call, an environment
    lookup), its children aside: visitors call it on each node they visit."""
    if isinstance(node, cst.Name):
        return _name_reads(node, names, depth)
    if isinstance(node, cst.Attribute):  # (only the attributes that tell the shape can: the meanings only then)
        if node.attr.value not in ATTRIBUTES:  # or a property of the notebook's own class, or what it assigns it
            return _returns_read(node, names, depth, properties=True) | _held(node, names, depth)
        return {w for w in (_of_value(m, names) for m in names.meanings(node)) if w}
    if isinstance(node, cst.Call):
        return _call_reads(node, names, depth)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) and \
            isinstance(node.slice[0].slice.value, (cst.SimpleString, cst.Name)) and \
            names.meanings(node.value) & ENVIRONMENT_READS:
        return _environment(node.slice[0].slice.value, names)
    return set()


def _name_reads(node, names, depth) -> set:
    if node.value in OWN:
        return {OWN[node.value]}
    if depth >= MAX_DEPTH:
        return set()
    cache = names.rank_reads
    if node not in cache:
        cache[node] = frozenset()  # a value that reads itself: what is known so far
        value = names.value(node)
        cache[node] = frozenset(_reads(value, names, depth + 1)) if value is not None else frozenset()
    return set(cache[node])


def _held(node, names, depth) -> set:
    """What the values the notebook's own class gives an attribute read of the job's shape: `env.rank` where its
    class assigns `self.rank = int(os.environ["RANK"])` or holds the field `rank: int = int(os.environ["RANK"])`."""
    cache = names.rank_reads
    if node not in cache:
        cache[node] = frozenset()  # a value that reads itself: what is known so far
        if depth < MAX_DEPTH:
            cache[node] = frozenset().union(*(_reads(v, names, depth + 1) for v in names.field_values(node, depth)))
    return set(cache[node])


def _call_reads(node, names, depth) -> set:
    if isinstance(node.func, cst.Attribute) and node.func.attr.value not in CALLED:  # a method of no value that
        return _returns_read(node.func, names, depth) | _module_reads(node.func, names, depth)  # tells the shape
    meanings = names.meanings(node.func)
    found = {DISTRIBUTED[m] for m in meanings if m in DISTRIBUTED} | {
        w for w in (_of_value(m, names) for m in meanings) if w}
    if "builtins.getattr" in meanings:  # `getattr(acc, "is_main_process")` is `acc.is_main_process`
        found |= {w for w in (_of_value(m, names) for m in names.meanings(node)) if w}
    args = node.args
    if isinstance(node.func, cst.Name):  # `who()` after `who = partial(os.environ.get, "RANK")`
        given = names.value(node.func)
        if isinstance(given, cst.Call) and names.meanings(given.func) & PARTIALS:
            args = (*given.args[1:], *args)
    if meanings & ENVIRONMENT_READS and args:
        found |= _environment(args[0].value, names)
    return found | _returns_read(node.func, names, depth) | _module_reads(node.func, names, depth)


def _module_reads(func, names, depth) -> set:
    """What a function of the notebook's own module returns of the job's shape (`%%writefile dist_info.py`, then
    `dist_info.is_lead()`: nbddp.written), read in that module's code as in the notebook's."""
    own, found = getattr(names, "own", None), set()
    for meaning in names.meanings(func) if own is not None and depth < MAX_DEPTH else ():
        inner, definition = own.definition(meaning) or (None, None)
        for value in returns_of(definition) if definition is not None else ():
            found |= _reads(value, inner, depth + 1)
    return found


def _returns_read(func, names, depth, properties=False) -> set:
    """What the notebook's own functions, lambdas or methods that `func` names return of the job's shape (only its
    properties, for an attribute that is not called)."""
    found, own = set(), names.rank_reads.get("methods")
    if own is None:  # the notebook's own method names: any other attribute names none of its definitions
        own = names.rank_reads["methods"] = frozenset(method.name.value for method in names.methods)
    if isinstance(func, cst.Attribute) and func.attr.value not in own or depth >= MAX_DEPTH:
        return found
    for definition in names.definitions(func):
        if isinstance(definition, cst.Lambda) and not properties:
            found |= _reads(definition.body, names, depth + 1)
        elif isinstance(definition, cst.FunctionDef) and (not properties or any(
                names.meanings(d.decorator) & PROPERTIES for d in definition.decorators)):
            for value in returns_of(definition):
                found |= _reads(value, names, depth + 1)
    return found


def _environment(key, names) -> set:
    value = names.literal(key)
    return {ENVIRONMENT[value]} if isinstance(value, str) and value in ENVIRONMENT else set()


class _Reads(cst.CSTVisitor):
    def __init__(self, names, depth):
        self.names, self.depth, self.found = names, depth, set()

    def on_visit(self, node):
        self.found |= _node_reads(node, self.names, self.depth)
        return True


def _reads(node, names, depth) -> set:
    cache = names.rank_reads
    key = ("node", node)
    if key not in cache:
        reads = _Reads(names, depth)
        walk(node, reads)
        cache[key] = frozenset(reads.found)
    return set(cache[key])


def reads_rank(node, names) -> frozenset:
    """What of the job's shape (RANK, WORLD) the node reads, by meaning (see the module's docstring)."""
    return frozenset(_reads(node, names, 0))


def is_rank_test(node, names) -> bool:
    """An `if` whose test reads the rank (`if accelerator.is_main_process:`, `if int(os.environ["RANK"]) == 0:`,
    `if main:` after `main = dist.get_rank() == 0`): its body is already per-process."""
    return isinstance(node, cst.If) and RANK in reads_rank(node.test, names)
