"""`%ddp N`: the notebook's own cells on N DDP ranks, cell by cell, their state kept between cells.

The parts, each small:

- `ddp_magics`: the `%ddp` line magic, the `%%ddp_cell` cell magic every cell is routed into while a session is on,
  and the input transformer that does the routing (`%%local` and `%ddp` cells stay in the kernel);
- `history`: each cell converted in the kernel by the converter's own pipeline, with the cells run before it (so
  that what earlier cells made on rank 0 only is remembered);
- `kernel`: the kernel's side of a session: torchrun started once, one connection per rank, a cell sent to every
  rank, rank 0's output streamed into the cell, the ranks' answers turned into the cell's outcome;
- `cellrun`: one cell's bookkeeping in the kernel (who finished, failed, waits at a barrier; when to interrupt;
  what the cell raises), pure code;
- `procs`: the torchrun process and its ranks (start, signal, stop);
- `wire`: the connection between the kernel and a rank (one local socket each, with an authentication key);
- `worker`: what each rank runs (`python -m nbddp.cellwise.worker` under torchrun): the runtime's rank facts and
  process group, then a loop that runs the cells it is sent in one namespace;
- `display`: rank 0's rich output (display(), the value of a cell's last expression, plots) sent to the kernel;
- `stop`: an interrupt stops a cell on every rank; inside a Trainer's loop, at the same step on every rank;
- `glue`: the names this package uses from the rest of nbddp's launcher (one place to repoint).
"""
