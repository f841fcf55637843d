"""Interrupting a cell on every rank (a rank's side).

The kernel forwards its interrupt to every rank as SIGINT. Outside a training loop the rank raises
KeyboardInterrupt at once, as a notebook does. Inside a Trainer's loop that could leave the ranks out of step (one
stops between two collectives while the other already waits in the next one, forever), so there the first SIGINT
only asks to stop: at the end of each step the ranks agree on it (one all-reduce of a flag), every rank ends the loop
after the same step (Trainer's own `should_training_stop`), and the cell stops with KeyboardInterrupt when the
Trainer has finished its bookkeeping. The model keeps what it learned up to that step, and the ranks stay in step.
A second SIGINT raises at once.
"""
from __future__ import annotations

import signal


class Stopper:
    def __init__(self):
        self.training = 0  # Trainer loops running on this rank
        self.asked = 0  # SIGINTs received during this cell
        self.stopping = False  # the ranks agreed to stop the loop

    def install(self):
        signal.signal(signal.SIGINT, self.handle)

    def new_cell(self):
        self.training, self.asked, self.stopping = 0, 0, False

    def handle(self, signum, frame):
        self.asked += 1
        if self.training and self.asked == 1:
            return  # the Trainer callback below stops the loop after this step, on every rank
        raise KeyboardInterrupt

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (an all-reduce of the flag; the ranks are in the same step)."""
        import torch
        import torch.distributed as dist

        flag = bool(self.asked)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            from ..runtime.group import NBDDP_DEVICE

            tensor = torch.tensor([int(flag)], device=NBDDP_DEVICE if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flag = bool(tensor.item())
        return flag

    def patch_trainer(self, module):
        """Every Trainer gets the callback (transformers.trainer's DEFAULT_CALLBACKS)."""
        from transformers.trainer_callback import TrainerCallback

        stopper = self

        class NbddpStopAtStep(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                stopper.training += 1

            def on_step_end(self, args, state, control, **kwargs):
                if not stopper.stopping and stopper.agreed():
                    stopper.stopping = True
                    control.should_training_stop = True

            def on_train_end(self, args, state, control, **kwargs):
                stopper.training = max(0, stopper.training - 1)
                if stopper.stopping:
                    from ..runtime.group import NBDDP_IS_MAIN

                    stopper.stopping = False
                    if NBDDP_IS_MAIN:
                        print(f"nbddp: training stopped by the interrupt after step {state.global_step}, on every "
                              "rank", flush=True)
                    raise KeyboardInterrupt

        module.DEFAULT_CALLBACKS.append(NbddpStopAtStep)
