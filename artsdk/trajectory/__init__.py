"""The trajectory: what a rollout produced, as records -- its LLM calls, their choices, the
outcome and rewards (``records``) -- and the views between chat messages and the other shapes
a call can take: Responses API items (``response_items``), Anthropic content blocks
(``message_blocks``), and conversations given as dicts or JSONL files (``conversations``)."""

from .records import (
    ROLES,
    Choice,
    ErrorInfo,
    Group,
    LLMCall,
    Message,
    Trajectory,
    as_message,
    check_messages,
    new_id,
    plain,
    utcnow,
)

__all__ = ["ROLES", "Choice", "ErrorInfo", "Group", "LLMCall", "Message", "Trajectory", "as_message",
           "check_messages", "new_id", "plain", "utcnow"]
