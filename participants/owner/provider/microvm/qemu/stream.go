package qemu

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ErrStream is returned (wrapped, with what was found and where) for a
// migration stream SplitRAM cannot read; a failed write of its outputs is
// not one.
var ErrStream = errors.New("microvm: migration stream")

// PageSize is the guest's page size in a migration stream (x86).
const PageSize = 4096

// GuestRAMBlock is the RAM block of the guest's memory backend (Machine's
// ram0 object) in a migration stream.
const GuestRAMBlock = "ram0"

// The stream's framing (QEMU's savevm.c, stream version 3).
const (
	streamMagic   = 0x5145564d // "QEVM"
	streamVersion = 3

	secEOF           = 0x00
	secStart         = 0x01
	secPart          = 0x02
	secEnd           = 0x03
	secFull          = 0x04
	secSubsection    = 0x05
	secConfiguration = 0x07
	secCommand       = 0x08
	secFooter        = 0x7e
)

// The RAM section's record flags (QEMU's ram.c), in the low bits of each
// record's be64 address.
const (
	ramZero     = 0x02
	ramMemSize  = 0x04
	ramPage     = 0x08
	ramEOS      = 0x10
	ramContinue = 0x20
	ramXBZRLE   = 0x40
	ramHook     = 0x80
	ramCompress = 0x100
	ramFlags    = PageSize - 1
)

// SplitStats says what SplitRAM moved.
type SplitStats struct {
	// Pages and ZeroPages count the block's records: written to the RAM
	// file, and left as its holes; Written counts the distinct pages
	// written (a page may be sent twice).
	Pages, ZeroPages, Written int64
	// BlockBytes is the block's size as the stream states it.
	BlockBytes int64
}

// SplitRAM copies a migration stream from r to state without the pages
// of the RAM block named block, which it writes into ram at their offsets
// in the block instead (a zero page is left as a hole: ram must read as
// zeros where nothing was written), which must be of size bytes, as the
// stream must say the block is. The state that remains holds the
// devices and the other, small, RAM blocks; a VM whose memory backend maps
// the RAM file copy-on-write takes it as its incoming migration and runs
// as the VM that was saved, reading its memory only as it touches it.
//
// It knows the precopy stream of a stopped VM: the header, the
// configuration, the RAM section's records (pages, zero pages, the block
// list, ends of section), and the device sections that follow, which it
// copies as they are. Anything else (compressed or XBZRLE pages, another
// iterative section, a stream version it does not know) is an error
// naming it, never a guess.
func SplitRAM(r io.Reader, state io.Writer, ram io.WriterAt, block string, size int64) (SplitStats, error) {
	out := &stateWriter{w: state}
	s := &splitter{r: bufio.NewReaderSize(r, 256<<10), w: bufio.NewWriterSize(out, 256<<10), ram: ram, block: block, size: size,
		sections: map[uint32]string{}}
	err := s.split()
	if err == nil {
		err = s.flushRun()
	}
	if err == nil {
		err = s.w.Flush()
	}
	var werr writeError
	switch {
	case out.err != nil:
		err = out.err // what failed was the state's write, or its bound
	case err != nil && !errors.Is(err, ErrStream) && !errors.As(err, &werr):
		err = fmt.Errorf("%w: at byte %d: %w", ErrStream, s.off, err)
	}
	return s.st, err
}

// MaxState bounds the state SplitRAM writes: the devices and the small
// RAM blocks of firmware and tables (about 70 KB for a microVM).
const MaxState = 64 << 20

// writeError is a failed write of the RAM file or the state: the disk's
// fault, not the stream's.
type writeError struct{ err error }

func (e writeError) Error() string { return e.err.Error() }
func (e writeError) Unwrap() error { return e.err }

// stateWriter writes the state, up to MaxState bytes, and keeps the first
// error.
type stateWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (sw *stateWriter) Write(p []byte) (int, error) {
	if sw.err != nil {
		return 0, sw.err
	}
	if sw.n+int64(len(p)) > MaxState {
		sw.err = fmt.Errorf("%w: the state passes %d bytes: more than a VM's devices", ErrStream, MaxState)
		return 0, sw.err
	}
	n, err := sw.w.Write(p)
	sw.n += int64(n)
	if err != nil {
		sw.err = writeError{fmt.Errorf("writing the state: %w", err)}
	}
	return n, sw.err
}

type splitter struct {
	r        *bufio.Reader
	w        *bufio.Writer
	off      int64 // bytes read
	ram      io.WriterAt
	block    string
	size     int64             // the block's size, which the stream must state
	ignored  bool              // x-ignore-shared: the block list carries each block's address
	sections map[uint32]string // section id → idstr, from the START sections
	st       SplitStats
	found    bool
	blocks   []string // the block list's names
	// lastRead is the block of the last page record read, to which one
	// marked "continue" refers; lastWritten that of the last one written
	// to state, to which one written marked "continue" refers.
	lastRead, lastWritten string
	// run is a run of the block's pages at runAt, not yet written.
	run   []byte
	runAt int64
	// written has a bit for each page of the block written: a zero page
	// sent again after its page was is written as zeros, not left.
	written []uint64
}

// wrote tells whether the block's page at off was written.
func (s *splitter) wrote(off int64) bool {
	i := off / PageSize
	return i/64 < int64(len(s.written)) && s.written[i/64]&(1<<(i%64)) != 0
}

func (s *splitter) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrStream, s.off, fmt.Sprintf(format, args...))
}

func (s *splitter) read(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(s.r, b); err != nil {
		return nil, noEOF(err)
	}
	s.off += int64(n)
	return b, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (s *splitter) byte1() (byte, error) {
	c, err := s.r.ReadByte()
	if err != nil {
		return 0, noEOF(err)
	}
	s.off++
	return c, nil
}

func (s *splitter) be32() (uint32, error) {
	b, err := s.read(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (s *splitter) be64() (uint64, error) {
	b, err := s.read(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// str reads a string of a byte's length.
func (s *splitter) str() (string, error) {
	n, err := s.byte1()
	if err != nil {
		return "", err
	}
	b, err := s.read(int(n))
	return string(b), err
}

func (s *splitter) put(b ...byte) { _, _ = s.w.Write(b) }

func (s *splitter) put32(v uint32) { s.put(binary.BigEndian.AppendUint32(nil, v)...) }

func (s *splitter) put64(v uint64) { s.put(binary.BigEndian.AppendUint64(nil, v)...) }

func (s *splitter) putStr(v string) {
	s.put(byte(len(v)))
	_, _ = s.w.WriteString(v)
}

func (s *splitter) split() error {
	magic, err := s.be32()
	if err != nil {
		return err
	}
	version, err := s.be32()
	if err != nil {
		return err
	}
	if magic != streamMagic || version != streamVersion {
		return s.errorf("magic %#x version %d, want %#x version %d", magic, version, streamMagic, streamVersion)
	}
	s.put32(magic)
	s.put32(version)
	for {
		kind, err := s.byte1()
		if err != nil {
			return err
		}
		switch kind {
		case secConfiguration:
			s.put(kind)
			if err := s.configuration(); err != nil {
				return err
			}
		case secCommand:
			s.put(kind)
			if err := s.command(); err != nil {
				return err
			}
		case secStart, secPart, secEnd:
			if err := s.iterative(kind); err != nil {
				return err
			}
		case secFull, secEOF:
			// The device sections and what follows them carry no RAM of
			// the block: they go as they are.
			s.put(kind)
			if err := s.flushRun(); err != nil {
				return err
			}
			if _, err := s.w.ReadFrom(s.r); err != nil {
				return err
			}
			if !s.found {
				return s.errorf("no RAM block %q in the stream (its blocks: %q)", s.block, s.blocks)
			}
			return nil
		default:
			return s.errorf("section type %#x", kind)
		}
	}
}

// configuration copies the configuration section: the machine type's
// name and its subsections, of which it reads the capabilities (the one
// that matters here: x-ignore-shared adds a field to the block list).
func (s *splitter) configuration() error {
	n, err := s.be32()
	if err != nil {
		return err
	}
	if n > 256 {
		return s.errorf("machine type name of %d bytes", n)
	}
	name, err := s.read(int(n))
	if err != nil {
		return err
	}
	s.put32(n)
	s.put(name...)
	for {
		c, err := s.r.Peek(1)
		if err != nil {
			return noEOF(err)
		}
		if c[0] != secSubsection {
			return nil
		}
		_, _ = s.byte1()
		sub, err := s.str()
		if err != nil {
			return err
		}
		ver, err := s.be32()
		if err != nil {
			return err
		}
		s.put(secSubsection)
		s.putStr(sub)
		s.put32(ver)
		switch sub {
		case "configuration/capabilities":
			count, err := s.be32()
			if err != nil {
				return err
			}
			s.put32(count)
			for range count {
				c, err := s.str()
				if err != nil {
					return err
				}
				s.putStr(c)
				if c == "x-ignore-shared" {
					s.ignored = true
				}
			}
		default:
			return s.errorf("configuration subsection %q", sub)
		}
	}
}

// command copies a command record: be16 command, be16 length, its data.
func (s *splitter) command() error {
	h, err := s.read(4)
	if err != nil {
		return err
	}
	data, err := s.read(int(binary.BigEndian.Uint16(h[2:])))
	if err != nil {
		return err
	}
	s.put(h...)
	s.put(data...)
	return nil
}

// iterative copies one iterative section's part: only RAM's is expected.
func (s *splitter) iterative(kind byte) error {
	id, err := s.be32()
	if err != nil {
		return err
	}
	s.put(kind)
	s.put32(id)
	if kind == secStart {
		idstr, err := s.str()
		if err != nil {
			return err
		}
		rest, err := s.read(8) // instance id, version id
		if err != nil {
			return err
		}
		s.putStr(idstr)
		s.put(rest...)
		s.sections[id] = idstr
	}
	if name, ok := s.sections[id]; !ok || name != "ram" {
		return s.errorf("iterative section %d (%q): only RAM's is known", id, name)
	}
	if err := s.ramRecords(); err != nil {
		return err
	}
	f, err := s.byte1()
	if err != nil {
		return err
	}
	fid, err := s.be32()
	if err != nil {
		return err
	}
	if f != secFooter || fid != id {
		return s.errorf("section %d ends with %#x %d, not its footer", id, f, fid)
	}
	s.put(f)
	s.put32(fid)
	return nil
}

// ramRecords reads RAM records up to an end of section: the block's pages
// go to the RAM file, every other record to state.
func (s *splitter) ramRecords() error {
	for {
		v, err := s.be64()
		if err != nil {
			return err
		}
		flags, addr := v&ramFlags, v&^ramFlags
		if flags&(ramXBZRLE|ramCompress|ramHook) != 0 {
			return s.errorf("RAM record flags %#x: compressed, XBZRLE and RDMA pages are not supported", flags)
		}
		switch flags &^ ramContinue {
		case ramEOS:
			s.put64(v)
			return nil
		case ramMemSize:
			s.put64(v)
			if err := s.blockList(addr); err != nil {
				return err
			}
			continue
		case ramZero, ramPage:
		default:
			return s.errorf("RAM record flags %#x", flags)
		}
		name := s.lastRead
		if flags&ramContinue == 0 {
			if name, err = s.str(); err != nil {
				return err
			}
		} else if name == "" {
			return s.errorf("a RAM record continues no block")
		}
		s.lastRead = name
		if name == s.block && flags&ramPage != 0 {
			if err := s.readPage(int64(addr)); err != nil {
				return err
			}
			continue
		}
		var page []byte
		var fill byte
		if flags&ramPage != 0 {
			if page, err = s.read(PageSize); err != nil {
				return err
			}
		} else if fill, err = s.byte1(); err != nil {
			return err
		}
		if name == s.block { // a zero page: a hole, unless filled otherwise
			if err := s.inBlock(addr); err != nil {
				return err
			}
			if fill == 0 && !s.wrote(int64(addr)) {
				s.st.ZeroPages++
				continue
			}
			if err := s.addPage(int64(addr), bytes.Repeat([]byte{fill}, PageSize)); err != nil {
				return err
			}
			continue
		}
		// Another block's record stays in the stream; "continue" only
		// where the record before it in the stream written is its block's.
		if name == s.lastWritten {
			s.put64(addr | flags | ramContinue)
		} else {
			s.put64(addr | (flags &^ ramContinue))
			s.putStr(name)
		}
		s.lastWritten = name
		if page != nil {
			s.put(page...)
		} else {
			s.put(fill)
		}
	}
}

// blockList copies the block list of a MEM_SIZE record: each block's name
// and length (and, with x-ignore-shared, its address), total bytes in all.
func (s *splitter) blockList(total uint64) error {
	for total > 0 {
		name, err := s.str()
		if err != nil {
			return err
		}
		length, err := s.be64()
		if err != nil {
			return err
		}
		s.putStr(name)
		s.put64(length)
		if s.ignored {
			addr, err := s.be64()
			if err != nil {
				return err
			}
			s.put64(addr)
		}
		if length > total {
			return s.errorf("block %q of %d bytes is past the list's total", name, length)
		}
		total -= length
		s.blocks = append(s.blocks, name)
		if name == s.block && s.found {
			return s.errorf("block %q listed again", name)
		}
		if name == s.block {
			if int64(length) != s.size || length%PageSize != 0 {
				return s.errorf("block %q is of %d bytes, not the guest's %d", name, length, s.size)
			}
			s.found, s.st.BlockBytes = true, int64(length)
		}
	}
	return nil
}

// inBlock checks that a page at addr lies inside the block.
func (s *splitter) inBlock(addr uint64) error {
	if s.st.BlockBytes < PageSize || addr > uint64(s.st.BlockBytes-PageSize) {
		return s.errorf("page at %#x is past the end of block %q (%d bytes)", addr, s.block, s.st.BlockBytes)
	}
	return nil
}

// runBytes is the most the run holds before it is written.
const runBytes = 1 << 20

// extend makes the run end at off, writing it first when a page at off
// does not extend it or it is full.
func (s *splitter) extend(off int64) error {
	if err := s.inBlock(uint64(off)); err != nil {
		return err
	}
	if len(s.run) > 0 && (off != s.runAt+int64(len(s.run)) || len(s.run)+PageSize > runBytes) {
		if err := s.flushRun(); err != nil {
			return err
		}
	}
	if len(s.run) == 0 {
		s.runAt = off
		if s.run == nil {
			s.run = make([]byte, 0, runBytes)
		}
	}
	if s.written == nil {
		s.written = make([]uint64, (s.st.BlockBytes/PageSize+63)/64)
	}
	i := off / PageSize
	if s.written[i/64]&(1<<(i%64)) == 0 {
		s.written[i/64] |= 1 << (i % 64)
		s.st.Written++
	}
	return nil
}

// addPage adds a page of the block at off.
func (s *splitter) addPage(off int64, page []byte) error {
	if err := s.extend(off); err != nil {
		return err
	}
	s.run = append(s.run, page...)
	s.st.Pages++
	return nil
}

// readPage reads the block's page at off from the stream into the run.
func (s *splitter) readPage(off int64) error {
	if err := s.extend(off); err != nil {
		return err
	}
	n := len(s.run)
	if _, err := io.ReadFull(s.r, s.run[n:n+PageSize]); err != nil {
		return noEOF(err)
	}
	s.off += PageSize
	s.run = s.run[:n+PageSize]
	s.st.Pages++
	return nil
}

// flushRun writes the run to the RAM file.
func (s *splitter) flushRun() error {
	if len(s.run) == 0 {
		return nil
	}
	_, err := s.ram.WriteAt(s.run, s.runAt)
	s.run = s.run[:0]
	if err != nil {
		return writeError{fmt.Errorf("writing the RAM file: %w", err)}
	}
	return nil
}
