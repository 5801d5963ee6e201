"""The ``tidemark`` command line: the top floor, which nothing else imports.

One module per command group; each adds its commands to the parser (``register``) and
holds their functions. :mod:`tidemark.cli.main` maps errors to exit codes.
"""
