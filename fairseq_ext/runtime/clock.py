"""The training clock a criterion's schedules read: the current epoch and update.

fairseq tells tasks, not criterions, where training is: ``task.begin_epoch(epoch,
model)`` at the start of every epoch (also the first epoch after a resume, with the
restored epoch) and ``task.train_step(..., update_num=...)`` at every step (with the
restored update count after a resume). ``TrainingClock(task)`` wraps those two
methods of the task instance to record both values, so schedules that are pure
functions of them (``fairseq_ext.core.schedules``) continue exactly where a
checkpoint left them, with any task.

One more hook tied to fairseq's training loop lives here: ``check_model_at_start``
(a model check at the first ``begin_epoch``, before any batch). Running state that
is not a function of the clock (PG's moving baseline) is carried through
checkpoints by ``fairseq_ext.runtime.checkpoints``.
"""

UNITS = ("epoch", "update")  # what a schedule counts: epochs completed or updates done


class TrainingClock:
    """``epoch`` (1-based, as fairseq counts) and ``num_updates`` (updates done)."""

    def __init__(self, task=None):
        self.epoch = 1
        self.num_updates = 0
        if task is not None:
            self.attach(task)

    def attach(self, task) -> None:
        begin_epoch, train_step = task.begin_epoch, task.train_step
        clock = self

        def clocked_begin_epoch(epoch, model):
            clock.epoch = int(epoch)
            return begin_epoch(epoch, model)

        def clocked_train_step(sample, model, criterion, optimizer, update_num, *args, **kwargs):
            clock.num_updates = int(update_num)
            return train_step(sample, model, criterion, optimizer, update_num, *args, **kwargs)

        task.begin_epoch = clocked_begin_epoch
        task.train_step = clocked_train_step

    def counter(self, unit: str) -> float:
        """Epochs completed (``epoch``) or updates done (``update``)."""
        if unit == "epoch":
            return float(self.epoch - 1)
        if unit == "update":
            return float(self.num_updates)
        raise ValueError(f"unknown schedule unit {unit!r}; choose from {UNITS}")


def check_model_at_start(task, check) -> None:
    """Call ``check(model)`` once, when fairseq starts the first epoch (before the
    first batch; a criterion is built before it ever sees the model), so that a
    model the criterion cannot train stops the run with ``check``'s error before any
    work, instead of failing inside the first training step."""
    begin_epoch = task.begin_epoch
    pending = [check]

    def checked_begin_epoch(epoch, model):
        if pending:
            pending.pop()(model)
        return begin_epoch(epoch, model)

    task.begin_epoch = checked_begin_epoch
