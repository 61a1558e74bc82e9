"""Statistics kept at write time: ``Reader.stats()`` returns a :class:`DatasetStats` (one
:class:`FieldStats` per field); ``rowstore stats DS`` prints them. See ``docs/stats.md``.

The names live in :mod:`rowstore.format.stats` (their stored form and merge); this module is
where users import them from.
"""

from rowstore.format.stats import DatasetStats, FieldStats, merge_stats

__all__ = ["DatasetStats", "FieldStats", "merge_stats"]
