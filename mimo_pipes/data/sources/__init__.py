"""Sources: what ``--dataset`` names (a ``save_to_disk`` folder, Parquet / JSON files, an Energon dataset or
metadataset) opened as one map-style source of rows, and the rows ``mimo-pipes check`` reads with their places."""
