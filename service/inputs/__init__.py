"""Where samples come from: finding input files, scanning them for rows and seek offsets, reading
a window's pieces, and the record formats (text, chat messages, prompt/completion)."""
