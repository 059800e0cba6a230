from __future__ import annotations

import sys

from relaykv.cli import main

sys.exit(main())
