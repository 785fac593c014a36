"""Acceptance rules: walk the verified drafts and decide `correct_drafts` and the `bonus_token`."""
