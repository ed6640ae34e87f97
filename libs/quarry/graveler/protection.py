"""Branch protection (lakeFS semantics): per-repository rules by branch-name pattern, each
blocking staging writes and/or commits on the branches it matches.

The rules live in the repository's partition under one key (layout.BRANCH_PROTECTION_KEY).
Enforcement reads them through a short cache, like the repository record: a staging write on
an unprotected repository costs no KV read in steady state (one read per repository per
CACHE_SECONDS). The price, as in lakeFS (which caches its settings too): a rule set on
another branch-manager can let a write through for at most CACHE_SECONDS after it is set.
The branch-manager that sets the rules sees them at once.

What it must never do: let a blocked action through once the cache holds the rule, or
half-apply a Set (a Set with a stale checksum changes nothing). Deleting a branch that any
rule protects is refused too (check_delete): DeleteBranch then CreateBranch at an older
commit would otherwise rewind a branch whose commits are blocked.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Sequence
from typing import TypeAlias

from quarry.graveler import errors as gerrors
from quarry.graveler import layout, names
from quarry.graveler.refs import Repository
from quarry.kv import store as kv
from quarry.lru import TTLCache
from quarry.v1 import branch_manager_pb2 as bm

STAGING_WRITE = bm.BRANCH_PROTECTION_BLOCKED_ACTION_STAGING_WRITE
COMMIT = bm.BRANCH_PROTECTION_BLOCKED_ACTION_COMMIT
_ACTION_NAMES = {STAGING_WRITE: "staging_write", COMMIT: "commit"}
MAX_RULES = 100
MAX_PATTERN_LENGTH = 256

Rules = list[bm.BranchProtectionRule]
Action: TypeAlias = bm.BranchProtectionBlockedAction.ValueType


def checksum_of(stored: bytes | None) -> str:
    """The checksum of the stored rules; no rules stored reads as an empty record."""
    return hashlib.sha256(stored or b"").hexdigest()


def matching_rule(
    rules: Sequence[bm.BranchProtectionRule], branch: str, action: Action
) -> bm.BranchProtectionRule | None:
    """The first rule whose pattern matches the whole branch name and that blocks `action`."""
    for rule in rules:
        if action in rule.blocked_actions and fnmatch.fnmatchcase(branch, rule.pattern):
            return rule
    return None


def check_rules(rules: Sequence[bm.BranchProtectionRule]) -> Rules:
    """The rules as stored (actions deduplicated and ordered), or INVALID_ARGUMENT."""
    if len(rules) > MAX_RULES:
        raise gerrors.InvalidName(f"at most {MAX_RULES} branch protection rules")
    seen: set[str] = set()
    out = []
    for rule in rules:
        if not rule.pattern or len(rule.pattern) > MAX_PATTERN_LENGTH or "/" in rule.pattern:
            raise gerrors.InvalidName(
                f"branch protection pattern {rule.pattern!r}: 1..{MAX_PATTERN_LENGTH} "
                "characters, no '/'",
                metadata={"pattern": rule.pattern},
            )
        if rule.pattern in seen:
            raise gerrors.InvalidName(
                f"branch protection pattern {rule.pattern!r} appears twice",
                metadata={"pattern": rule.pattern},
            )
        seen.add(rule.pattern)
        actions = set(rule.blocked_actions)
        if not actions or not actions <= set(_ACTION_NAMES):
            raise gerrors.InvalidName(
                f"branch protection rule {rule.pattern!r} must block staging_write and/or "
                f"commit (got {sorted(actions)})",
                metadata={"pattern": rule.pattern},
            )
        out.append(bm.BranchProtectionRule(pattern=rule.pattern, blocked_actions=sorted(actions)))
    return out


class BranchProtection:
    """The rules of each repository instance: read, replaced under a checksum, enforced."""

    CACHE_SECONDS = 2.0  # as RefManager.REPOSITORY_TTL_SECONDS

    def __init__(self, store: kv.Store) -> None:
        self.kv = store
        # (repository, instance id) → rules, for CACHE_SECONDS
        self._cache = TTLCache(self.CACHE_SECONDS)

    def get(self, repo: Repository) -> tuple[Rules, str]:
        """The stored rules and their checksum (fresh)."""
        stored = self._read(repo)
        value = None if stored is None else stored.value
        rules = [] if value is None else layout.decode_branch_protection(repo.partition, value)
        self._cache.put((repo.name, repo.instance_id), rules)
        return rules, checksum_of(value)

    def set(
        self, repo: Repository, rules: Sequence[bm.BranchProtectionRule], if_checksum: str = ""
    ) -> str:
        """Replace the rules; with if_checksum only if the stored rules still have it
        (FAILED_PRECONDITION / PRECONDITION_FAILED otherwise, nothing changed)."""
        checked = check_rules(rules)
        value = layout.encode_branch_protection(checked)
        if not if_checksum:
            self.kv.set(repo.partition, layout.BRANCH_PROTECTION_KEY, value)
        else:
            stored = self._read(repo)
            if checksum_of(None if stored is None else stored.value) != if_checksum:
                raise self._changed(repo)
            predicate = kv.ABSENT if stored is None else kv.Equals(stored.predicate)
            try:
                self.kv.set_if(repo.partition, layout.BRANCH_PROTECTION_KEY, value, predicate)
            except kv.PredicateFailed:
                raise self._changed(repo) from None
        self._cache.put((repo.name, repo.instance_id), checked)
        return checksum_of(value)

    def check(self, repo: Repository, branch: str, action: Action) -> None:
        """FAILED_PRECONDITION / BRANCH_PROTECTED when a rule blocks `action` on `branch`
        (the rules as cached: at most CACHE_SECONDS old)."""
        names.check_branch_name(branch)
        rule = matching_rule(self._cached(repo), branch, action)
        if rule is not None:
            raise gerrors.BranchProtected(
                f"branch {branch!r} is protected by rule {rule.pattern!r}: "
                f"{_ACTION_NAMES[action]} is blocked",
                metadata={
                    "repository": repo.name,
                    "branch": branch,
                    "pattern": rule.pattern,
                    "blocked_action": _ACTION_NAMES[action],
                },
            )

    def check_delete(self, repo: Repository, branch: str) -> None:
        """FAILED_PRECONDITION / BRANCH_PROTECTED when any rule (blocking staging writes or
        commits) matches `branch`: a deleted branch recreated at another commit would move
        its HEAD past every blocked action."""
        names.check_branch_name(branch)
        rules = self._cached(repo)
        rule = matching_rule(rules, branch, COMMIT) or matching_rule(rules, branch, STAGING_WRITE)
        if rule is not None:
            raise gerrors.BranchProtected(
                f"branch {branch!r} is protected by rule {rule.pattern!r}: it cannot be deleted",
                metadata={
                    "repository": repo.name,
                    "branch": branch,
                    "pattern": rule.pattern,
                    "blocked_action": "delete",
                },
            )

    def _cached(self, repo: Repository) -> Rules:
        cached = self._cache.get((repo.name, repo.instance_id), ttl=self.CACHE_SECONDS)
        if cached is not None:
            return cached
        return self.get(repo)[0]

    def _read(self, repo: Repository) -> kv.GetResult | None:
        try:
            return self.kv.get(repo.partition, layout.BRANCH_PROTECTION_KEY)
        except kv.KeyNotFound:
            return None

    @staticmethod
    def _changed(repo: Repository) -> gerrors.ProtectionRulesChanged:
        return gerrors.ProtectionRulesChanged(
            f"the branch protection rules of {repo.name!r} changed since if_checksum was "
            "read; read them again",
            metadata={"repository": repo.name},
        )


__all__ = ["COMMIT", "STAGING_WRITE", "BranchProtection", "checksum_of", "matching_rule"]
