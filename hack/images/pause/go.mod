module tunefleet.local/pause

go 1.22
