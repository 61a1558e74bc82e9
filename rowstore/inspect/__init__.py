"""Look at a dataset: the report page (:func:`report`, ``rowstore report DS -o report.html``) and
the notebook views (:func:`show`; readers, mixtures and schemas draw themselves in Jupyter).

See ``docs/inspect.md``.
"""

from rowstore.inspect._report import QUALITY_BATCHES, QUALITY_ROWS, report, report_html
from rowstore.reader.view import View, show

__all__ = ["report", "report_html", "show", "View", "QUALITY_ROWS", "QUALITY_BATCHES"]
