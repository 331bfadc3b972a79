"""The bad-input suite: one module per family of input, each case a row of data."""
