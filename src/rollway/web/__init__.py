"""What every HTTP surface shares: route handlers and error bodies (``handlers``), request
validation (``parse_model``), the pooled client session (``http_client``), uvicorn servers
under limits (``uvicorn_server``, ``background_server``) and OpenAPI schemas (``openapi``)."""
