"""What crosses a process boundary, typed and defined once: the options of each job kind (`options.py`), read by
every layer (the settings take their defaults from it), so this package imports nothing from kernel_lsp.

Nothing is imported here: the settings import contracts.options, below everything else.
"""
