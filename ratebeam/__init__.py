"""ratebeam: CloudKitty-compatible usage rating as an Apache Beam pipeline.

The code lives in the top-level folders `pipelines/`, `transforms/` and `connectors/`, installed as
`ratebeam.pipelines`, `ratebeam.transforms` and `ratebeam.connectors` (see pyproject.toml).
"""

__version__ = "0.1.0"
