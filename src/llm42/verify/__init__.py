"""Verification: canonical config, windows, the canonical pass and the commit rule."""

from llm42.verify.canonical_pass import CanonicalPass
from llm42.verify.verifier import CanonicalWork, LaunchedPass, Verifier
from llm42.verify.windows import CanonicalConfig, Commit, commit_window

__all__ = ["CanonicalConfig", "CanonicalPass", "CanonicalWork", "Commit", "LaunchedPass", "Verifier",
           "commit_window"]
