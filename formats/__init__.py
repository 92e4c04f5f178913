"""Dataset formats: readers, the Sequence record and the Mixtrain writer side. Never imports Beam."""

__version__ = "0.1.0"
