"""Writers of other formats from a Mixtrain dataset (the reverse of formats/sources/)."""
