"""What an administrator sets for a host of the lab, beyond what its workers find themselves."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

GIB = 1 << 30


class HostCapacity(models.Model):
    """The host tier's capacity for trials' spill stores on one host, chosen by an administrator: it replaces
    what the host's workers found when they started (90% of the spill directory's file system, or
    ``HYDRA_SPILL_CAPACITY_BYTES``) and takes effect at the host's next admission of a trial."""

    host_id = models.CharField(max_length=63, unique=True, help_text="The host's HYDRA_HOST_ID.")
    capacity_gib = models.FloatField(
        validators=[MinValueValidator(0.001)],
        help_text="GiB of the host tier (/dev/shm, or the disk tier) that trials' spill stores may take at once.")

    class Meta:
        ordering = ["host_id"]
        verbose_name_plural = "host capacities"

    def __str__(self) -> str:
        return f"{self.host_id}: {self.capacity_gib:g} GiB"

    @classmethod
    def bytes_for(cls, host_id: str) -> int | None:
        """The capacity set for `host_id` in bytes, or None when the host keeps its own."""
        found = cls.objects.filter(host_id=host_id).values_list("capacity_gib", flat=True).first()
        return None if found is None else int(found * GIB)


class SkippedEntry(models.Model):
    """An entry of a host's Redis stream that the ingest could not store or apply, and moved past so that the
    entries after it (every other trial's, every other team's) go on. A trial event is also recorded against
    its trial, which fails with why (`webapp.experiments.events`). The health page lists the latest; the entry
    itself stays in Redis until the stream's cap drops it (``XRANGE hydra:<host>:<stream> <id> <id>``)."""

    host = models.CharField(max_length=64)
    stream = models.CharField(max_length=16, help_text="events, steps, evals, spans, samples or checkpoints.")
    entry_id = models.CharField(max_length=40, help_text="The Redis stream entry id on its host.")
    trial = models.CharField(max_length=64, blank=True, help_text="The queue id of the trial it was about, if any.")
    error = models.TextField(help_text="Why it could not be stored or applied.")
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created", "-pk"]
        verbose_name_plural = "skipped stream entries"

    def __str__(self) -> str:
        return f"{self.host}:{self.stream} {self.entry_id}"
