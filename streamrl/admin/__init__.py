"""The admin HTTP endpoint served by the controller (docs/design.md §1, issue 6).

```
  streamrl admin … / curl ──HTTP + Bearer token──► AdminServer (uvicorn on uvloop, a thread
                                                    of the controller process)
                                                      │ create_app: auth, live-key checks, audit
                                                      ▼
                                                    RunControl (the controller)
```

Modules: ``auth`` (token and run-directory files), ``live`` (which keys change live and how a
value is checked), ``audit`` (``audit.jsonl``), ``api`` (the FastAPI app and the ``RunControl``
Protocol), ``server`` (uvicorn in a thread, ``start_admin``), ``client`` (stdlib-only client
used by ``streamrl admin``).

This package's ``__init__`` imports nothing: ``streamrl admin`` loads only ``client`` and
``auth``, so the command line never imports fastapi, uvicorn, torch or ray.
"""
