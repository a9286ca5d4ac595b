"""Object storage: ``s3://`` URLs for ``--dataset`` and ``--image-folder``, read through s3fs with bounded
concurrency, retries and a bounded cache (``pip install "mimo-pipes[s3]"``)."""
