"""The gateway over HTTP: ``gateway_app.create_app`` and the three API dialects it speaks,
named alike (``chat_completions_api``, ``responses_api``, ``messages_api``), with their wire
models (``request_schema``), SSE answers (``sse_response``) and lease routes."""
