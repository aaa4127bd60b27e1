// Package image is the owner's image cache: it resolves a task's image
// reference, checks the image, unpacks each of its layers once into a
// content-addressed directory and hands the providers the layers to stand
// a sandbox's root on (provider.Image).
//
// A reference (Get) is one of:
//
//   - an absolute path to a directory: an OCI image layout. Its index.json
//     holds one image, or the reference picks one with a suffix
//     "@sha256:<hex>" (the manifest's digest) or ":<name>" (the annotation
//     org.opencontainers.image.ref.name);
//   - an absolute path to a file: a docker save archive, holding one image
//     or picked by ":<repo>:<tag>". It has no manifest: the image's digest
//     is its config's (docker's image id);
//   - anything else: a registry reference (go-containerregistry's
//     name.ParseReference), pulled with the credentials of the docker
//     config (authn.DefaultKeychain); loopback registries are plain HTTP.
//
// The path part ends at the first ':' or '@' after its last '/'.
//
// Before anything is unpacked, every blob is checked: present, of the
// digest and size its manifest gives, and every layer of the diff id its
// config gives. Each layer entry is made beneath its layer's directory
// without following a symbolic link; an absolute or climbing name, a hard
// link out of the layer or a write through a link is refused (ErrBadImage).
// A layer is staged and renamed into place only when the whole image is
// good, so a bad image leaves nothing in the cache.
//
// The cache directory holds:
//
//	layers/<diffid hex>/      an unpacked layer: an overlay lowerdir, its
//	                          whiteouts as 0/0 character devices and its
//	                          opaque directories marked trusted.overlay.opaque=y
//	layermeta/<hex>.json      the layer's size, measured at its unpack
//	images/<digest hex>.json  an image: refs, digest, diff ids, Env,
//	                          WorkingDir, User, size and last use
//	holds/<holder>            a Hold: the digest of an image Prune keeps
//	locks/, lock, tmp/        file locks and staging
//	prune-pending             a prune a busy Get left to the next
//
// A layer that unpacks to more than Options.MaxBytes is refused
// (ErrBadImage). A whiteout hides only lower layers' entries, as the OCI
// image spec says: an entry of its own layer stays.
//
// Two Gets of one layer, in one process or two sharing the directory,
// unpack it once (a file lock per layer). Prune removes images least
// recently used first (Get and Lookup mark use) until the layers are under
// Options.MaxBytes, never an image held; a layer goes with the last image
// standing on it, deleted after the cache's lock is let go. A Get that
// unpacked prunes; when others keep the cache busy it leaves the prune
// pending (prune-pending) for the next Get. GetHeld records a hold under
// the lock of its check, so that nothing prunes the image before its user
// holds it; Holders lists holds by prefix, for a process to release
// those an earlier one left. Rootfs writes an image's merged tree into a
// directory, for a provider that makes a disk of it.
//
// The package needs Linux, and root for the owners and devices of layers.
package image
