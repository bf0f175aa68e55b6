"""Conversations: a prompt's leading blocks, which instance holds them, and whether moving a
turn to another instance pays for processing its history again. Pure but for the index's
memory; it knows nothing of tuning."""

from tuner.sessions.index import Held, PrefixIndex
from tuner.sessions.moves import Turn, move_pays
from tuner.sessions.prefix import BLOCK_CHARS, Prompt, prompt_of

__all__ = ["BLOCK_CHARS", "Held", "PrefixIndex", "Prompt", "Turn", "move_pays", "prompt_of"]
