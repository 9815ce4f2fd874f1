"""Where the tests find the repository and the real data beside it (``../shared/data``).

CI always has ``shared/`` beside the checkout: tests that need it assert it exists and fail
loudly, never skip."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
