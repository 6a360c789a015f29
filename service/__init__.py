"""packfeed.service: packing, tokenization, the Ray Data pipeline, the CLI.

What other packages (``packfeed.trainer``) and users import from it is listed in one module,
``packfeed.service.face`` (its ``__all__``), not here: this ``__init__`` runs before every
service module, on every packing actor too, so it imports nothing.
"""
