"""Processing: one dataset row (a conversation with its images and videos) made into model fields, whole or
for one module, counted from headers before the exchange; the vision families, media decoding, truncation."""
