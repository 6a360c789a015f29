"""The ``packfeed`` subcommands of the service: pack, serve, inspect (train lives in
packfeed.trainer.launch.command). Each module has ``HELP``, ``ORDER``, ``add_arguments(parser)`` and
``run(args) -> int`` and is registered in the ``packfeed.commands`` entry-point group."""
