"""hwrun's tests: libraries that allocate on the current device at import are imported first.

bitsandbytes (imported by peft, and by Transformers' Trainer stack) builds a tensor on the
"current" accelerator at import; under `hwenv.testing.fake_xpu` that device is reported but cannot
allocate (hwenv.testing's README), so they are imported here, before any fake is entered.
"""

import peft  # noqa: F401
import transformers.trainer  # noqa: F401
