"""What to read and in which order: the data config, the mixture's sample order, the stream plan
(windows of pieces, fixed before any sample is read) and the driver's probe of the first window."""
