# The ranks' live records as `@progress RECORD` lines, one per file awk is given (a record is one line, written
# without a newline; a file's lines are joined). A record that outgrows MAX_RECORD_BYTES while it is read (the file
# grew after find looked) is dropped, so what the probe prints is bounded per record.
function flush() { if (seen && length(r) <= @MAX_RECORD_BYTES@) print "@progress " r; r = "" }
FNR == 1 { flush(); seen = 1 }
length(r) <= @MAX_RECORD_BYTES@ { r = r $0 }
END { flush() }
