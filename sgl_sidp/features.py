"""The one table of the overlay's features: `--overlay-mode` value -> `sgl_sidp.feature.Feature`.

Adding a technique adds its folder and one line here. A mode of `sgl_sidp.config.SidpMode`
without an entry is documented in `--help` but rejected as not implemented.
"""

from __future__ import annotations

from sgl_sidp.feature import Feature
from sgl_sidp.shift.feature import FEATURE as SHIFT
from sgl_sidp.sidp.feature import FEATURE as SIDP
from sgl_sidp.zerodp.feature import FEATURE as ZERODP

FEATURES: dict[str, Feature] = {f.name: f for f in (ZERODP, SIDP, SHIFT)}
