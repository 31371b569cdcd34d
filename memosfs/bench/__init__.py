"""`memosfs bench ...`: one module per benchmark.  Imported by the CLI only."""
