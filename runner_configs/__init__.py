"""The runner configs shipped with ratebeam: data files, no code.

``ratebeam run --runner-config <name>.yaml`` finds them here when there is no such file in the
current directory.
"""
