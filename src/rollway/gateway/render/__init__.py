"""From messages to token ids and back: the chat template as string pieces
(``chat_template``, ``message_template``), the bound on a turn's tokens (``token_bound``),
tool calls parsed from completions (``tool_calls``) and a streamed turn's text held back until
it is safe to send (``turn_stream``)."""
