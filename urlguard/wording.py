"""Plain words for the counts the admin and the jobs report."""


def counted(n: int, noun: str) -> str:
    """A count with its noun, for messages: 1 rule, 2,000 rules."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
