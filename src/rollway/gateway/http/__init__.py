"""The gateway over HTTP: ``gateway_app.create_app`` (its route table as data), handlers by
resource (``rollout_routes``, ``chat_routes``, ``weight_routes``, ``lease_routes``), and the
three API dialects it speaks, named alike (``chat_completions_api``, ``responses_api`` with
``responses_stream``, ``messages_api``), with their wire models (``request_schema``) and SSE
answers (``sse_response``)."""
