package memstore

// list is an intrusive doubly-linked list of entries in order of use, the
// most recent first. Its links live in the entries, so that moving an
// entry is a few pointer writes. The shard's mu guards it.
type list struct {
	root entry // root.next is the most recently used entry, root.prev the least
}

func (l *list) init() { l.root.next, l.root.prev = &l.root, &l.root }

func (l *list) pushFront(e *entry) {
	e.prev, e.next = &l.root, l.root.next
	e.next.prev = e
	l.root.next = e
}

func (l *list) remove(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (l *list) moveToFront(e *entry) {
	if l.root.next == e {
		return
	}
	l.remove(e)
	l.pushFront(e)
}

// back returns the least recently used entry, or nil.
func (l *list) back() *entry { return l.prev(&l.root) }

// prev returns the entry used just less recently than e, or nil.
func (l *list) prev(e *entry) *entry {
	if e.prev == &l.root {
		return nil
	}
	return e.prev
}
