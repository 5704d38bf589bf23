"""The scheduler: requests, admission, chunked prefill, decode, preemption and speculative rollback over
the page allocator and the radix prefix cache. One step's work is a ``BatchPlan``."""

from dsakv.scheduler.batch import BatchPlan
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Request
from dsakv.scheduler.scheduler import Scheduler

__all__ = ["BatchPlan", "Request", "Scheduler", "SchedulerConfig"]
