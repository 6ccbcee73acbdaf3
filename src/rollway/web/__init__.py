"""What every HTTP surface shares: route handlers and error bodies (``handlers``), the pooled
client session (``http_client``), uvicorn servers under limits (``uvicorn_server``,
``background_server``) and OpenAPI schemas (``openapi``). Bodies are validated by
``rollway.validation.parse_model``, which in-process callers share without this stack."""
