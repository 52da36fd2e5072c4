"""Development only, never in an image: the local test bed, local-dev helpers and `trtforge demo`."""
