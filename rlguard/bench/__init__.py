"""``rlguard.bench``: reproducible measurements that need the package (the collapse benchmark)."""
