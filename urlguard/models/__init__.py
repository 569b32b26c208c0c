"""The app's models, one module per domain; every model keeps the `urlguard` app label
and its table, so the split moved no data."""

from urlguard.models.actors import (
    Actor,
    UserOrNone,
    row_user,
)
from urlguard.models.allowlist import (
    AllowedHost,
    AllowlistRefusal,
)
from urlguard.models.apikeys import (
    APIKey,
)
from urlguard.models.changes import (
    CHANGE_LOG_LOCK,
    ChangeEvent,
    ChangeEventManager,
    ChangeSet,
)
from urlguard.models.feeds import (
    FeedHold,
    FeedRefresh,
    RuleSource,
    Source,
)
from urlguard.models.jobs import (
    AdminJob,
    AdminJobChunk,
)
from urlguard.models.nodes import (
    NodeStatus,
)
from urlguard.models.reports import (
    MistakeReport,
)
from urlguard.models.rules import (
    Category,
    RuleWriteError,
    SpamRule,
    SpamRuleQuerySet,
    expression_key,
    now_micros,
    rule_writes_allowed,
)
from urlguard.models.shortlinks import (
    COUNTER_FIELDS,
    REDIRECT_FIELDS,
    Click,
    ShortLink,
    ShortLinkGeneration,
    ShortLinkQuerySet,
)
from urlguard.models.statistics import (
    HitEvent,
    HostHitDay,
    RuleHitDay,
    RuleHitTotal,
    StatsLoss,
)

__all__ = [
    "APIKey",
    "Actor",
    "AdminJob",
    "AdminJobChunk",
    "AllowedHost",
    "AllowlistRefusal",
    "CHANGE_LOG_LOCK",
    "COUNTER_FIELDS",
    "Category",
    "ChangeEvent",
    "ChangeEventManager",
    "ChangeSet",
    "Click",
    "FeedHold",
    "FeedRefresh",
    "HitEvent",
    "HostHitDay",
    "MistakeReport",
    "NodeStatus",
    "REDIRECT_FIELDS",
    "RuleHitDay",
    "RuleHitTotal",
    "RuleSource",
    "RuleWriteError",
    "ShortLink",
    "ShortLinkGeneration",
    "ShortLinkQuerySet",
    "Source",
    "SpamRule",
    "SpamRuleQuerySet",
    "StatsLoss",
    "UserOrNone",
    "expression_key",
    "now_micros",
    "row_user",
    "rule_writes_allowed",
]
