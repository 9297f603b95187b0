"""The graph experiment (Table II): InfoGraph's GIN with UCL, H-UCL, SCL and H-SCL."""
