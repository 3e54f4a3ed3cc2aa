"""What a tokenizer does around a text, read off a sample encoding (one owner for the probe's BOS policy and the
export's check of the tokenizer it writes)."""

from __future__ import annotations


def sample_encoding(tokenizer) -> tuple[str, list[int], list[int]]:
    """A short text and its ids without and with the tokenizer's special tokens (what a tokenizer adds around a
    text is read off these): "hello", or, for a tokenizer that cannot encode it (a word-level vocabulary without an
    unknown token), the text of its first ordinary vocabulary entry (not a special or added special token).

    Returns:
        (text, plain ids, ids with special tokens).
    """
    def encoded(text: str) -> tuple[str, list[int], list[int]]:
        return (text, list(tokenizer(text, add_special_tokens=False)["input_ids"]),
                list(tokenizer(text, add_special_tokens=True)["input_ids"]))

    try:
        return encoded("hello")
    except Exception:  # noqa: BLE001  (tokenizers raises its own exception types)
        special = {int(i) for i in tokenizer.all_special_ids}
        special |= {int(i) for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
                    if getattr(t, "special", False)}
        return encoded(tokenizer.decode([next(i for i in range(len(tokenizer)) if i not in special)]))


__all__ = ["sample_encoding"]
