"""Dataset formats: readers, the Sequence record and the Mixtrain writer side. Never imports Beam."""
