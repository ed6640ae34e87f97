"""range-writer: the only writer of ranges and metaranges to object storage."""
