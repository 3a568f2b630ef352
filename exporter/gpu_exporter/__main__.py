"""``python -m gpu_exporter`` runs the command line."""

from __future__ import annotations

import sys

from gpu_exporter.cli import main

sys.exit(main())
