"""Evaluation shared by scripts/, examples/ and tests/: reading fairseq-generate
output, translation and tagging scores, paired tests and tables, figures. Not
imported by the plugin itself."""
