"""The training clock a criterion's schedules read: the current epoch and update.

fairseq tells tasks, not criterions, where training is: ``task.begin_epoch(epoch,
model)`` at the start of every epoch (also the first epoch after a resume, with the
restored epoch) and ``task.train_step(..., update_num=...)`` at every step (with the
restored update count after a resume). ``TrainingClock(task)`` wraps those two
methods of the task instance to record both values, so schedules that are pure
functions of them (``fairseq_ext.core.schedules``) continue exactly where a
checkpoint left them, with any task.

Two more pieces of criterion state tied to fairseq's training loop live here:
``check_model_at_start`` (a model check at the first ``begin_epoch``, before any
batch) and ``CheckpointedValue`` (a running value, PG's moving baseline, that a
resumed run continues).
"""
from fairseq.logging import metrics
from fairseq.logging.meters import AverageMeter


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
        raise ValueError(f"unknown schedule unit {unit!r}; choose epoch or update")


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


class CheckpointedValue:
    """One float of a criterion's running state (PG's moving baseline) that a resumed
    run continues exactly. fairseq checkpoints a criterion's state only when it has
    parameters and does not give a task its state back on resume; it does save its
    metrics with every checkpoint, and restores them when it resumes within an epoch
    (at an epoch boundary it resets them). The value lives in a metrics aggregator of
    its own, ``fairseq_ext/NAME`` (never logged or printed), together with the epoch
    it was set in, and counts only within that epoch: it restarts with every epoch,
    so an interrupted run continues exactly wherever the checkpoint was taken.
    ``--reset-meters`` and the first launch of ``--finetune-from-model`` clear it; so
    does building a new instance (fairseq builds the criterion before it loads the
    checkpoint, so a resume still restores it). None when unset."""

    def __init__(self, name: str, clock: TrainingClock):
        self.name = f"fairseq_ext/{name}"
        self.clock = clock
        meters = metrics.get_meters(self.name)
        if meters is not None:
            for key in ("value", "epoch"):
                if key in meters:
                    meters[key].reset()

    def get(self):
        value, epoch = metrics.get_meter(self.name, "value"), metrics.get_meter(self.name, "epoch")
        if value is None or value.count == 0 or epoch is None or int(epoch.val) != self.clock.epoch:
            return None
        return float(value.val)

    def set(self, value: float) -> None:
        with metrics.aggregate(self.name):  # creates the aggregator; nothing is logged inside
            pass
        meters = metrics.get_meters(self.name)
        for key, v in (("value", float(value)), ("epoch", float(self.clock.epoch))):
            if key not in meters:
                meters.add_meter(key, AverageMeter(), priority=0)
            meters[key].reset()
            meters[key].update(v)
