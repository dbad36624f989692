"""Verification: canonical config, windows, the canonical pass and the commit rule."""

from llm42.verify.verifier import CanonicalWork, Verifier
from llm42.verify.windows import CanonicalConfig, Commit, commit_window

__all__ = ["CanonicalConfig", "CanonicalWork", "Commit", "Verifier", "commit_window"]
